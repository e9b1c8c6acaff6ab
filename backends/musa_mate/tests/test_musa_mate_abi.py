"""The MATE ABI adapter against fakes of every MATE generation: keywords, LSE flags, layouts, backend."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from magi2_backend_musa_mate.mate_abi import MateVarlen, load_mate_varlen, normalise_lse
from musa_fakes import CORE_GENERATIONS, LSE_FLAG, SIGNATURES, FakeVarlen, MusaWorld, varlen_case

from magi2_core.testing import call_record

_ALWAYS = {
    "q",
    "k",
    "v",
    "cu_seqlens_q",
    "cu_seqlens_k",
    "max_seqlen_q",
    "max_seqlen_k",
    "softmax_scale",
    "causal",
    "softcap",
    "deterministic",
}
ALL_GENERATIONS = (*CORE_GENERATIONS, "wrapper-v0.2.2")


def _bound(world: MusaWorld, generation: str, **fake: Any) -> tuple[MateVarlen, FakeVarlen]:
    if generation.startswith("wrapper"):
        world.platform(True)
        world.runtime()
        world.mate(None)
        f = FakeVarlen(generation, **fake)
        world.wrapper(f, version="0.2.2")
    else:
        f = world.musa_with(generation, **fake)
    mate = load_mate_varlen()
    assert isinstance(mate, MateVarlen), mate
    return mate, f


def _call(
    mate: MateVarlen,
    dtype: torch.dtype = torch.bfloat16,
    *,
    seed: int = 5,
    softcap: float = 0.0,
    return_lse: bool = True,
    deterministic: bool = False,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    c = varlen_case(dtype, seed=seed)
    return mate(
        call_record(
            "attention",
            c.q,
            c.k,
            c.v,
            c.cu_q,
            c.cu_k,
            max_seqlen_q=c.max_q,
            max_seqlen_k=c.max_k,
            softmax_scale=64**-0.5,
            softcap=softcap,
            deterministic=deterministic,
        ),
        return_lse=return_lse,
        backend=backend,
    )


@pytest.mark.parametrize("generation", ALL_GENERATIONS)
def test_exact_keywords_with_lse(world: MusaWorld, generation: str) -> None:
    mate, fake = _bound(world, generation)
    c = varlen_case(torch.bfloat16, seed=11)
    o, lse = mate(
        call_record(
            "attention",
            c.q,
            c.k,
            c.v,
            c.cu_q,
            c.cu_k,
            max_seqlen_q=c.max_q,
            max_seqlen_k=c.max_k,
            softmax_scale=64**-0.5,
            softcap=0.0,
            deterministic=True,
        ),
        return_lse=True,
        backend=None,
    )
    args, kw = fake.calls[-1]
    assert args == ()  # keywords only: positions differ between MATE generations
    assert set(kw) == _ALWAYS | {LSE_FLAG[generation]}  # no backend: MATE's default 'auto' stays in charge
    assert kw[LSE_FLAG[generation]] is True
    assert kw["q"] is c.q and kw["k"] is c.k and kw["v"] is c.v
    assert kw["cu_seqlens_q"] is c.cu_q and kw["cu_seqlens_k"] is c.cu_k
    assert kw["cu_seqlens_q"].dtype == kw["cu_seqlens_k"].dtype == torch.int32
    assert (kw["max_seqlen_q"], kw["max_seqlen_k"]) == (6, 7)
    assert type(kw["max_seqlen_q"]) is int and type(kw["max_seqlen_k"]) is int
    assert kw["softmax_scale"] == 64**-0.5 and kw["causal"] is False and kw["softcap"] == 0.0
    assert kw["deterministic"] is True
    assert o.shape == c.q.shape and lse is not None and lse.shape == (4, 9) and lse.dtype == torch.float32


def test_v013_gets_the_newer_flag_only(world: MusaWorld) -> None:
    mate, fake = _bound(world, "v0.1.3")
    _call(mate)
    assert fake.last_kwargs["return_softmax_lse"] is True and "return_attn_probs" not in fake.last_kwargs


@pytest.mark.parametrize("generation", ALL_GENERATIONS)
def test_output_only_call_asks_for_no_lse(world: MusaWorld, generation: str) -> None:
    mate, fake = _bound(world, generation)
    o, lse = _call(mate, return_lse=False)
    assert lse is None and o.shape == (9, 4, 64)
    assert not any(key.startswith("return_") for key in fake.last_kwargs)


@pytest.mark.parametrize("generation", CORE_GENERATIONS)
@pytest.mark.parametrize("softcap,sent", [(-1.0, 0.0), (0.0, 0.0), (-7.5, 0.0)])
def test_non_positive_softcap_reaches_mate_as_zero_with_auto_backend(
    world: MusaWorld, generation: str, softcap: float, sent: float
) -> None:
    mate, fake = _bound(world, generation)
    _call(mate, softcap=softcap)
    assert fake.last_kwargs["softcap"] == sent and "backend" not in fake.last_kwargs


@pytest.mark.parametrize("generation", CORE_GENERATIONS)
def test_positive_softcap_selects_mutlass(world: MusaWorld, generation: str) -> None:
    """MATE < 0.2.1 'auto' can route a softcapped call to mubin, which has no softcap."""
    mate, fake = _bound(world, generation)
    _call(mate, softcap=2.0)
    assert fake.last_kwargs["softcap"] == 2.0 and fake.last_kwargs["backend"] == "mutlass"


def test_wrapper_softcap_needs_mate_0_2_1(world: MusaWorld) -> None:
    mate, fake = _bound(world, "wrapper-v0.2.2")
    _call(mate, softcap=2.0)
    assert fake.last_kwargs["softcap"] == 2.0 and "backend" not in fake.last_kwargs
    old = MateVarlen.bind(fake, "flash_attn_interface", "0.2.0")
    assert any("0.2.1" in w for w in old.unsupported(softcap=True, lse=True, deterministic=False, override=None))
    with pytest.raises(NotImplementedError, match="mubin"):
        _call(old, softcap=2.0)


@pytest.mark.parametrize("backend", ["auto", "mutlass", "mubin"])
def test_backend_override_is_forwarded(world: MusaWorld, backend: str) -> None:
    mate, fake = _bound(world, "v0.2.2")
    _call(mate, backend=backend)
    assert fake.last_kwargs["backend"] == backend


def test_backend_override_errors(world: MusaWorld) -> None:
    mate, fake = _bound(world, "v0.2.2")
    assert mate.unsupported(softcap=False, lse=True, deterministic=False, override="cutlass")
    assert mate.unsupported(softcap=True, lse=True, deterministic=False, override="mubin")
    assert mate.unsupported(softcap=False, lse=True, deterministic=False, override="mutlass") == []
    with pytest.raises(NotImplementedError, match="mubin kernel has no softcap"):
        _call(mate, softcap=1.0, backend="mubin")
    wrapper = MateVarlen.bind(FakeVarlen("wrapper-v0.2.2"), "flash_attn_interface", "0.2.2")
    assert any(
        "no 'backend' parameter" in w
        for w in wrapper.unsupported(softcap=False, lse=True, deterministic=False, override="mutlass")
    )
    assert fake.calls == []  # refused before MATE was called


def test_signature_without_lse_flag_cannot_serve_lse() -> None:
    def old_build(
        q: Any,
        k: Any,
        v: Any,
        cu_seqlens_q: Any = None,
        cu_seqlens_k: Any = None,
        max_seqlen_q: Any = None,
        max_seqlen_k: Any = None,
        softmax_scale: Any = None,
        causal: bool = False,
        softcap: float = 0.0,
        deterministic: bool = False,
    ) -> Any:
        raise AssertionError("must not be called")

    mate = MateVarlen.bind(old_build, "mate.mha_interface", "0.0.9")
    assert mate.lse_flag is None
    assert mate.unsupported(softcap=False, lse=False, deterministic=False, override=None) == []
    assert mate.unsupported(softcap=False, lse=True, deterministic=False, override=None)
    with pytest.raises(NotImplementedError, match="no LSE"):
        _call(mate, return_lse=True)


@pytest.mark.parametrize("generation", CORE_GENERATIONS)
def test_token_major_lse_is_transposed(world: MusaWorld, generation: str) -> None:
    mate_ht, _ = _bound(world, generation)
    o_ref, lse_ref = _call(mate_ht, seed=21)
    mate_th = MateVarlen.bind(FakeVarlen(generation, lse_layout="th"), "mate.mha_interface", "0.2.2")
    o, lse = _call(mate_th, seed=21)
    assert lse is not None and lse_ref is not None
    assert lse.shape == (4, 9) and lse.is_contiguous()
    torch.testing.assert_close(lse, lse_ref, rtol=0, atol=0)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=0)


def test_normalise_lse_layouts() -> None:
    ht = torch.randn(4, 9)
    assert normalise_lse(ht, 4, 9) is ht
    th = torch.randn(9, 4)
    out = normalise_lse(th, 4, 9)
    assert out.shape == (4, 9) and out.is_contiguous() and torch.equal(out, th.t())
    square = torch.randn(6, 6)
    assert normalise_lse(square, 6, 6) is square  # ambiguous: left alone, as upstream
    with pytest.raises(RuntimeError, match="shape"):
        normalise_lse(torch.randn(5, 9), 4, 9)
    with pytest.raises(RuntimeError, match="shape"):
        normalise_lse(torch.randn(1, 4, 9), 4, 9)
    with pytest.raises(RuntimeError, match="FP32"):
        normalise_lse(torch.randn(4, 9).to(torch.bfloat16), 4, 9)
    with pytest.raises(RuntimeError, match="non-tensor"):
        normalise_lse([[0.0]], 1, 1)


def test_malformed_results_raise(world: MusaWorld) -> None:
    mate, _ = _bound(world, "v0.2.2", result=lambda kw: kw["q"].clone())
    with pytest.raises(RuntimeError, match="not \\(out, lse\\)"):
        _call(mate, return_lse=True)
    mate = MateVarlen.bind(
        FakeVarlen("v0.2.2", result=lambda kw: kw["q"][:, :2].clone()), "mate.mha_interface", "0.2.2"
    )
    with pytest.raises(RuntimeError, match="expected \\[9, 4, 64\\]"):
        _call(mate, return_lse=False)


@pytest.mark.parametrize(
    "error", [RuntimeError("MUSA error: invalid device function"), ValueError("bad shape"), TypeError("bad ABI")]
)
def test_mate_errors_propagate_unchanged(world: MusaWorld, error: Exception) -> None:
    mate, _ = _bound(world, "v0.2.2", error=error)
    with pytest.raises(type(error)) as info:
        _call(mate)
    assert info.value is error


def test_signature_is_read_through_functools_wraps(world: MusaWorld) -> None:
    """MATE decorates its API with ``@mate_api`` (functools.wraps): the signature must still be read."""
    import functools

    inner = FakeVarlen("v0.1.0")

    @functools.wraps(inner)
    def logged(*args: Any, **kwargs: Any) -> object:
        return inner(*args, **kwargs)

    mate = MateVarlen.bind(logged, "mate.mha_interface", "0.1.0")
    assert mate.lse_flag == "return_attn_probs" and not mate.accepts_any
    _call(mate)
    assert inner.last_kwargs["return_attn_probs"] is True


# -- finding the entry point ----------------------------------------------------------------------
def test_core_module_is_preferred_over_the_wrapper(world: MusaWorld) -> None:
    world.musa_with("v0.2.2")
    world.finder.missing.pop("flash_attn_interface")
    world.wrapper(FakeVarlen("wrapper-v0.2.2"))
    mate = load_mate_varlen()
    assert isinstance(mate, MateVarlen) and mate.source == "mate.mha_interface" and mate.version == "0.2.2"
    assert "flash_attn_interface" not in world.finder.imported


def test_mate_wrapper_is_used_when_it_is_what_is_installed(world: MusaWorld) -> None:
    mate, _ = _bound(world, "wrapper-v0.2.2")
    assert mate.source == "flash_attn_interface" and mate.version == "0.2.2"
    assert mate.params == frozenset(SIGNATURES["wrapper-v0.2.2"])


def test_upstream_fa3_module_is_not_mistaken_for_mate(world: MusaWorld) -> None:
    world.platform(True)
    world.runtime()
    world.mate(None)
    world.wrapper(FakeVarlen("wrapper-v0.2.2"), version="3.0.0b1")
    why = load_mate_varlen()
    assert isinstance(why, str) and "not MATE's wrapper" in why and "No module named 'mate'" in why


@pytest.mark.parametrize("missing", ["torchada", "torch_musa"])
def test_missing_runtime_is_a_reason(world: MusaWorld, missing: str) -> None:
    world.platform(True)
    world.runtime(**{missing: False})
    world.mate(FakeVarlen("v0.2.2"))
    why = load_mate_varlen()
    assert isinstance(why, str) and missing in why
    assert "mate" not in world.finder.imported


def test_broken_mate_install_is_an_error_not_an_absence(world: MusaWorld) -> None:
    world.musa_with("v0.2.2")
    world.finder.broken["mate.mha_interface"] = RuntimeError("libmusart.so: version mismatch")
    with pytest.raises(RuntimeError, match="version mismatch"):
        load_mate_varlen()
