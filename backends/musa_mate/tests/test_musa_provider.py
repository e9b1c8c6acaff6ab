"""The ``mate`` kernel object on CPU tensors with a fake MATE: the FP32 sink correction, LSE, errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import musa_fakes
import pytest
import torch
from magi2_backend_musa_mate import plugin as mate_plugin
from magi2_backend_musa_mate.provider import SINK_CORRECTION_ENV, mate_attention
from magi2_backend_reference.attention import reference_attention
from musa_fakes import CORE_GENERATIONS, LSE_FLAG, FakeTritonSinks, FakeVarlen, MusaWorld, varlen_case

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_attention, accept_lse, within_ulps
from magi2_core.model.problem import Feature, Problem
from magi2_core.reasons import ReasonCode
from magi2_core.selection import registry
from magi2_core.sink_correction.reference import sink_correction, sink_scale
from magi2_core.testing import call_record
from magi2_core.testing.specials import SINK_KINDS, SinkKind, sink_logits

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))  # the float64 oracles of this monorepo
import oracles

SEEDS = (3, 17, 2024)
DTYPES = (torch.bfloat16, torch.float16)


def _problem(*features: Feature) -> Problem:
    return Problem(
        op="attention",
        device_type="musa",
        dtype="bfloat16",
        features=frozenset(features),
        tokens=64,
        tokens_k=64,
        max_seqlen_q=64,
        max_seqlen_k=64,
        num_segments=1,
        head_dim=128,
        num_heads_q=4,
        num_heads_kv=2,
    )


def _preset(o: torch.Tensor, lse: torch.Tensor) -> Any:
    return lambda kw: (o, lse) if any(kw.get(f) for f in ("return_attn_probs", "return_softmax_lse")) else o


def _run(
    dtype: torch.dtype,
    *,
    seed: int,
    sinks: torch.Tensor | None,
    softcap: float = 0.0,
    return_lse: bool = False,
    rescale: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    c = varlen_case(dtype, seed=seed)
    return mate_attention(
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
            sinks=sinks,
            sink_rescale=rescale,
            deterministic=False,
            return_lse=return_lse,
        )
    )


def _sigmoid_oracle(o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """vllm-omni #7307's oracle: promote, scale by sigmoid(L - logsumexp(sinks)) in FP32, cast once."""
    return (o.float() * torch.sigmoid(lse.T - torch.logsumexp(sinks, 0)).unsqueeze(-1)).to(o.dtype)


# -- the FP32 sink correction ---------------------------------------------------------------------
@pytest.mark.parametrize("generation", CORE_GENERATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sink_count", [0, 1, 2])
def test_upstream_case_is_bit_exact_to_the_sigmoid_oracle(
    world: MusaWorld, generation: str, dtype: torch.dtype, sink_count: int
) -> None:
    """The inputs of upstream's test_musa_dispatch_reuses_fp32_sink_correction, compared with rtol=atol=0."""
    out = torch.linspace(0.1, 0.9, 9 * 4 * 64).reshape(9, 4, 64).to(dtype)
    lse = torch.linspace(-2, 3, 36).reshape(4, 9)
    sinks = None if not sink_count else torch.linspace(-0.98765, 0.12345, sink_count * 4).reshape(sink_count, 4)
    original = None if sinks is None else sinks.clone()
    fake = world.musa_with(generation, result=_preset(out, lse))
    actual, _ = _run(dtype, seed=19, sinks=sinks, softcap=2.0)
    expected = out if sinks is None else _sigmoid_oracle(out, lse, sinks)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    kw = fake.last_kwargs
    assert kw["softcap"] == 2.0 and kw["softmax_scale"] == 64**-0.5
    assert (kw["max_seqlen_q"], kw["max_seqlen_k"]) == (6, 7)
    assert kw["cu_seqlens_q"].dtype == kw["cu_seqlens_k"].dtype == torch.int32
    assert kw["causal"] is False
    assert not any(kw.get(name) is not None for name in ("learnable_sink", "sinks", "s_aux"))
    if sinks is None:
        assert actual is out and LSE_FLAG[generation] not in kw
    else:
        assert kw[LSE_FLAG[generation]] is True
        assert sinks.dtype == torch.float32 and torch.equal(sinks, original)
        # The activation-dtype rescale rounds differently, so the exact match above pins FP32.
        scaled = out * torch.sigmoid(lse.T - torch.logsumexp(sinks, 0)).to(dtype).unsqueeze(-1)
        assert not torch.equal(scaled, expected)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("sink_count", [1, 2, 3])
def test_random_case_is_promote_rescale_cast_once(
    world: MusaWorld, dtype: torch.dtype, seed: int, sink_count: int
) -> None:
    """Fresh random inputs: bit-exact to the core's FP32 rule, within one output ULP of the sigmoid form.

    The core's scale is exp(L - logaddexp(L, Ls)) in FP32 (the upstream formula); it can differ from
    sigmoid(L - Ls) in the last FP32 bit, which moves a BF16/FP16 rounding now and then.
    """
    g = torch.Generator().manual_seed(seed)
    out = (torch.randn(9, 4, 64, generator=g) * 2).to(dtype)
    lse = torch.randn(4, 9, generator=g) * 3
    sinks = torch.randn(sink_count, 4, generator=g) * 3
    original = sinks.clone()
    world.musa_with("v0.2.2", result=_preset(out, lse))
    actual, new_lse = _run(dtype, seed=seed, sinks=sinks, return_lse=True)
    scale, lse_ref = sink_scale(lse, sinks)
    expected = (out.float() * scale.t().unsqueeze(-1)).to(dtype)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    assert new_lse is not None
    torch.testing.assert_close(new_lse, lse_ref, rtol=0, atol=0)
    torch.testing.assert_close(new_lse, torch.logaddexp(lse, torch.logsumexp(sinks, 0)[:, None]), rtol=0, atol=0)
    close = within_ulps(actual, _sigmoid_oracle(out, lse, sinks), 1.0)
    assert close, close
    assert sinks.dtype == torch.float32 and torch.equal(sinks, original)


@pytest.mark.parametrize("seed", SEEDS)
def test_activation_rescale_is_honoured(world: MusaWorld, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    out = torch.randn(9, 4, 64, generator=g).to(torch.bfloat16)
    lse = torch.randn(4, 9, generator=g) * 3
    sinks = torch.randn(1, 4, generator=g)
    world.musa_with("v0.2.2", result=_preset(out, lse))
    actual, _ = _run(torch.bfloat16, seed=seed, sinks=sinks, rescale="activation")
    expected, _ = sink_correction(out, lse, sinks, rescale="activation")
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)


@pytest.mark.parametrize("generation", CORE_GENERATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("lse_layout", ["ht", "th"])
def test_end_to_end_matches_the_exact_reference(
    world: MusaWorld, generation: str, dtype: torch.dtype, seed: int, lse_layout: str
) -> None:
    """A fake MATE that computes sink-free attention exactly: adapter + correction vs the reference."""
    world.musa_with(generation, lse_layout=lse_layout)
    c = varlen_case(dtype, seed=seed, cu_q=(0, 5, 5, 17), cu_k=(0, 6, 9, 20), heads=6, kv_heads=2)
    g = torch.Generator().manual_seed(seed + 1)
    sinks = torch.randn(2, 6, generator=g) * 2
    kwargs: dict[str, Any] = dict(
        max_seqlen_q=c.max_q,
        max_seqlen_k=c.max_k,
        softmax_scale=64**-0.5,
        softcap=3.0,
        sinks=sinks,
        sink_rescale="fp32",
        deterministic=False,
        return_lse=True,
    )
    o, lse = mate_attention(call_record("attention", c.q, c.k, c.v, c.cu_q, c.cu_k, **kwargs))
    o_ref, lse_ref = reference_attention(call_record("attention", c.q, c.k, c.v, c.cu_q, c.cu_k, **kwargs))
    assert lse is not None and lse_ref is not None
    assert accept_attention(o, o_ref)
    assert accept_lse(lse, lse_ref, dtype)
    assert o.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (6, 17)


@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize("kind", SINK_KINDS)
def test_upstream_sink_kinds(world: MusaWorld, kind: SinkKind, n_sinks: int, rescale: str) -> None:
    """Upstream's sink kinds (normal, large, -inf, +inf, all -inf) through the adapter and the correction."""
    world.musa_with("v0.2.2")
    c = varlen_case(torch.bfloat16, seed=23, cu_q=(0, 5, 12, 20), cu_k=(0, 6, 6, 19), heads=4, kv_heads=2)
    sinks = sink_logits(kind, n_sinks, 4, torch.Generator().manual_seed(n_sinks))
    kwargs: dict[str, Any] = dict(
        max_seqlen_q=c.max_q,
        max_seqlen_k=c.max_k,
        softmax_scale=64**-0.5,
        softcap=0.0,
        sink_rescale=rescale,
        deterministic=False,
        return_lse=True,
    )
    o, lse = mate_attention(call_record("attention", c.q, c.k, c.v, c.cu_q, c.cu_k, sinks=sinks, **kwargs))
    o_ref, lse_ref = reference_attention(call_record("attention", c.q, c.k, c.v, c.cu_q, c.cu_k, sinks=sinks, **kwargs))
    assert lse is not None and lse_ref is not None
    assert accept_attention(o, o_ref), accept_attention(o, o_ref)
    assert accept_lse(lse, lse_ref, torch.bfloat16), accept_lse(lse, lse_ref, torch.bfloat16)
    plain_o, plain_lse = mate_attention(call_record("attention", c.q, c.k, c.v, c.cu_q, c.cu_k, sinks=None, **kwargs))
    assert oracles.sink_kind_violations(o, lse, sinks, plain_o, plain_lse) == []


def test_no_sinks_no_lse_returns_mates_output(world: MusaWorld) -> None:
    world.musa_with("v0.2.2")
    o, lse = _run(torch.bfloat16, seed=1, sinks=None)
    assert lse is None and o.shape == (9, 4, 64)


def test_empty_sink_tensor_is_no_sink(world: MusaWorld) -> None:
    fake = world.musa_with("v0.2.2")
    o, _ = _run(torch.bfloat16, seed=2, sinks=torch.empty(0, 4))
    assert "return_softmax_lse" not in fake.last_kwargs and o.shape == (9, 4, 64)


# -- errors and availability ----------------------------------------------------------------------
@pytest.mark.parametrize("error", [RuntimeError("device failure"), ValueError("bad shape"), TypeError("bad ABI")])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_kernel_failures_are_never_swallowed(world: MusaWorld, error: Exception, with_sinks: bool) -> None:
    world.musa_with("v0.2.2", error=error)
    with pytest.raises(type(error), match=str(error)):
        _run(torch.bfloat16, seed=4, sinks=torch.randn(1, 4) if with_sinks else None)


@pytest.mark.parametrize("missing", ["mate", "torch_musa", "torchada"])
def test_import_error_makes_the_provider_ineligible(world: MusaWorld, missing: str) -> None:
    world.platform(True)
    world.runtime(torchada=missing != "torchada", torch_musa=missing != "torch_musa")
    world.mate(None if missing == "mate" else FakeVarlen("v0.2.2"))
    world.wrapper(None)
    reasons = mate_attention.check(_problem())
    assert [r.code for r in reasons] == [ReasonCode.UNAVAILABLE]
    assert missing in reasons[0].detail
    with pytest.raises(RuntimeError, match="unavailable"):
        _run(torch.bfloat16, seed=0, sinks=None)


def test_check_accepts_every_declared_feature(world: MusaWorld) -> None:
    world.musa_with("v0.1.0")
    assert (
        mate_attention.check(_problem(Feature.SOFTCAP, Feature.SINKS, Feature.GQA, Feature.LSE, Feature.DETERMINISTIC))
        == []
    )


def test_check_reports_unservable_features(world: MusaWorld) -> None:
    world.musa_with("v0.2.2")
    world.monkeypatch.setenv("MAGI2_MATE_BACKEND", "mubin")
    m2.reload_config()
    assert mate_attention.check(_problem()) == []
    reasons = mate_attention.check(_problem(Feature.SOFTCAP))
    assert [r.code for r in reasons] == [ReasonCode.CHECK] and "no softcap" in reasons[0].detail
    world.monkeypatch.setenv("MAGI2_MATE_BACKEND", "fast")
    with pytest.raises(m2.ConfigError, match=r"MAGI2_MATE_BACKEND='fast'.*auto \| mutlass \| mubin"):
        m2.reload_config()


def test_sink_correction_switch(world: MusaWorld, monkeypatch: pytest.MonkeyPatch) -> None:
    out = torch.randn(9, 4, 64).to(torch.bfloat16)
    lse = torch.randn(4, 9)
    sinks = torch.randn(1, 4)
    world.musa_with("v0.2.2", result=_preset(out, lse))
    seen: list[str] = []

    def fake_triton(
        o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, *, rescale: str, return_lse: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(rescale)
        return sink_correction(o, lse, sinks, rescale=rescale)  # type: ignore[arg-type]

    # The process registry holds this backend, whose setting forces MUSA's correction, and one backend that
    # contributes a correction named "triton" (the fake).
    reg = registry.Registry(discover=False)
    reg.register(mate_plugin.magi2_backend, "musa_mate")
    reg.register(FakeTritonSinks(), "fake_triton_sinks")
    assert reg.state().forced_by == {"musa": SINK_CORRECTION_ENV}
    monkeypatch.setattr(registry, "_REGISTRY", reg)
    monkeypatch.setattr(musa_fakes, "triton_correction", fake_triton)
    monkeypatch.setenv(SINK_CORRECTION_ENV, "triton")
    m2.reload_config()
    _run(torch.bfloat16, seed=0, sinks=sinks)
    assert seen == ["fp32"]
    monkeypatch.setenv(SINK_CORRECTION_ENV, "numpy")
    with pytest.raises(m2.ConfigError, match=r"MAGI2_MATE_SINK_CORRECTION='numpy'.*torch \| triton"):
        m2.reload_config()
    monkeypatch.delenv(SINK_CORRECTION_ENV)
    m2.reload_config()
    _run(torch.bfloat16, seed=0, sinks=sinks)
    assert seen == ["fp32"]  # the torch correction is the default
