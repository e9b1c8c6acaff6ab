"""CPU tests of the FA3 provider with fake FA3 modules: discovery, ABI variants, what is passed and returned."""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest
import torch
from fa3_fakes import FakeVarlen, install
from magi2_backend_cuda_fa3 import abi as abi_mod
from magi2_backend_cuda_fa3 import discovery
from magi2_backend_cuda_fa3.abi import load_fa3
from magi2_backend_cuda_fa3.discovery import FoundBuild
from magi2_backend_cuda_fa3.plugin import descriptor, head_dims, magi2_backend
from magi2_backend_cuda_fa3.provider import FA3Attention
from magi2_backend_reference.attention import reference_attention

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_attention, accept_lse
from magi2_core.model.problem import Feature, Problem
from magi2_core.model.virtual_device import VirtualDevice
from magi2_core.profiles import shipped_profiles
from magi2_core.reasons import ReasonCode
from magi2_core.sink_correction.choice import sink_correction_for, torch_correction
from magi2_core.sink_correction.reference import sink_correction
from magi2_core.testing import call_record
from magi2_core.testing.specials import SINK_KINDS, sink_logits

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))  # the float64 oracles live with the core tests of this monorepo
import oracles  # noqa: E402

D = 64
SCALE = D**-0.5


def _build(
    kind: str = "fa3-fwd", module: str = "fake_fa3_fwd_interface", ns: str = "fa3_fwd", **flags: bool
) -> FoundBuild:
    dist = {"fa3-fwd": "fa3-fwd", "flash_attn_3": "flash_attn_3", "tokenspeed-fa3": "tokenspeed-fa3"}.get(kind)
    return FoundBuild(
        kind,
        (module,),
        ns,
        dist,
        "9.9.9",  # type: ignore[arg-type]
        {f"FLASHATTENTION_DISABLE_{k}": v for k, v in flags.items()},
    )


@pytest.fixture
def ops_registered(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """Which torch.ops namespaces pretend to have ``fwd`` (a CUDA extension loaded)."""
    present: set[str] = set()
    monkeypatch.setattr(abi_mod, "torch_op_exists", lambda ns, name: ns in present and name == "fwd")
    return present


def _provider(
    monkeypatch: pytest.MonkeyPatch,
    ops: set[str],
    fake: FakeVarlen,
    build: FoundBuild,
    cc: tuple[int, int] | None = (9, 0),
) -> FA3Attention:
    install(monkeypatch, build.modules[0], fake)
    ops.add(build.op_namespace)
    return FA3Attention(
        loader=lambda: load_fa3((build,)), correction=lambda: torch_correction("test"), capability=lambda index: cc
    )


def _inputs(seed: int, cu: list[int], hq: int = 4, hkv: int = 2, n_sinks: int = 1, dtype: torch.dtype = torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(cu[-1], hq, D, generator=g).to(dtype)
    k = torch.randn(cu[-1], hkv, D, generator=g).to(dtype)
    v = torch.randn(cu[-1], hkv, D, generator=g).to(dtype)
    sinks = (torch.randn(n_sinks, hq, generator=g) * 2 + 2).float() if n_sinks else None
    lens = [b - a for a, b in itertools.pairwise(cu)]
    return q, k, v, torch.tensor(cu, dtype=torch.int32), max(lens), sinks


def _call(p: FA3Attention, q, k, v, cu, mx, sinks, *, softcap=0.0, rescale="fp32", return_lse=True):
    return p(
        call_record(
            "attention",
            q,
            k,
            v,
            cu,
            cu,
            max_seqlen_q=mx,
            max_seqlen_k=mx,
            softmax_scale=SCALE,
            softcap=softcap,
            sinks=sinks,
            sink_rescale=rescale,
            deterministic=False,
            return_lse=return_lse,
        )
    )


def _ref(q, k, v, cu, mx, sinks, *, softcap=0.0, rescale="fp32"):
    return reference_attention(
        call_record(
            "attention",
            q,
            k,
            v,
            cu,
            cu,
            max_seqlen_q=mx,
            max_seqlen_k=mx,
            softmax_scale=SCALE,
            softcap=softcap,
            sinks=sinks,
            sink_rescale=rescale,
            deterministic=False,
            return_lse=True,
        )
    )


# ---------------------------------------------------------------------------------------------
# discovery (no kernel import)
# ---------------------------------------------------------------------------------------------
def test_build_flags_are_read_without_executing_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "fake_fa3_cfg.py").write_text(
        "CONFIG = {'build_flags': {'FLASHATTENTION_DISABLE_FP16': True, 'FLASHATTENTION_DISABLE_SOFTCAP': False}}\n"
        "raise RuntimeError('executed')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert discovery.read_build_flags("fake_fa3_cfg") == {
        "FLASHATTENTION_DISABLE_FP16": True,
        "FLASHATTENTION_DISABLE_SOFTCAP": False,
    }
    assert discovery.read_build_flags("no_such_fa3_config_module") == {}


@pytest.mark.parametrize(
    ("modules", "dists", "expected"),
    [
        (set(), {}, []),
        ({"fa3_fwd_interface"}, {"fa3-fwd": "0.0.3"}, [("fa3-fwd", "fa3-fwd 0.0.3", None)]),
        ({"flash_attn_interface"}, {"flash_attn_3": "3.0.0"}, [("flash_attn_3", "flash_attn_3 3.0.0", None)]),
        (
            {"flash_attn_interface"},
            {"tokenspeed-fa3": "3.0.0.post1"},
            [("tokenspeed-fa3", "tokenspeed-fa3 3.0.0.post1", None)],
        ),
        ({"flash_attn_interface"}, {"flash_attn_3": "0.2.2"}, [("mate", "flash_attn_3 0.2.2", "MATE")]),
        (
            {"fa3_fwd_interface", "flash_attn_interface"},
            {"fa3-fwd": "0.0.3", "flash_attn_3": "3.0.0"},
            [("fa3-fwd", "fa3-fwd 0.0.3", None), ("flash_attn_3", "flash_attn_3 3.0.0", None)],
        ),
    ],
)
def test_find_builds_classifies_and_orders(monkeypatch, modules, dists, expected) -> None:
    monkeypatch.setattr(discovery, "_module_exists", lambda name: name in modules)
    monkeypatch.setattr(discovery, "dist_version", lambda name: dists.get(name))
    monkeypatch.setattr(discovery, "read_build_flags", lambda name: {})
    found = discovery.find_builds()
    assert [(b.kind, b.label) for b in found] == [(k, lab) for k, lab, _ in expected]
    for b, (_, _, refusal) in zip(found, expected, strict=False):
        assert (b.refusal is None) == (refusal is None)
        if refusal:
            assert refusal in b.refusal and "0.2.2" in b.refusal
    tokenspeed = [b for b in found if b.kind == "tokenspeed-fa3"]
    if tokenspeed:  # its wheel compiles softcap out even when its flag file is missing
        assert tokenspeed[0].disabled("SOFTCAP")


# ---------------------------------------------------------------------------------------------
# loading: ABI variants, refusals, preference order
# ---------------------------------------------------------------------------------------------
def test_builds_are_discovered_once_for_the_descriptor_and_the_first_load(monkeypatch, ops_registered) -> None:
    build = _build(FP16=True)
    install(monkeypatch, build.modules[0], FakeVarlen())
    ops_registered.add(build.op_namespace)
    calls: list[int] = []

    def counting() -> tuple[FoundBuild, ...]:
        calls.append(1)
        return (build,)

    monkeypatch.setattr(discovery, "find_builds", counting)
    discovery.process_builds.cache_clear()
    try:
        assert "fa3-fwd 9.9.9" in magi2_backend().providers[0].version
        got = load_fa3()
        assert got.abi is not None and "fa3-fwd 9.9.9" in got.abi.label
        assert len(calls) == 1
    finally:
        discovery.process_builds.cache_clear()  # the next user discovers what is really installed


def test_fa3_fwd_abi(monkeypatch, ops_registered) -> None:
    install(monkeypatch, "fake_fa3_fwd_interface", FakeVarlen())
    ops_registered.add("fa3_fwd")
    got = load_fa3((_build(FP16=True),))
    assert got.abi is not None and got.attempts == ()
    a = got.abi
    assert (a.lse_flag, a.softcap, a.sinks, a.fp16, a.sm8x, a.cc_majors) == (
        "return_attn_probs",
        True,
        False,
        False,
        True,
        (8, 9),
    )
    assert "fa3-fwd 9.9.9" in a.label


def test_return_softmax_lse_variant_and_missing_lse_flag(monkeypatch, ops_registered) -> None:
    install(monkeypatch, "fake_up", FakeVarlen(lse_flag="return_softmax_lse"))
    ops_registered.add("flash_attn_3")
    a = load_fa3((_build("flash_attn_3", "fake_up", "flash_attn_3"),)).abi
    assert a is not None and a.lse_flag == "return_softmax_lse"
    install(monkeypatch, "fake_nolse", FakeVarlen(lse_flag="return_aux"))
    got = load_fa3((_build("flash_attn_3", "fake_nolse", "flash_attn_3"),))
    assert got.abi is None and "no LSE flag" in got.why_none()


def test_tokenspeed_abi_has_native_sinks_and_no_softcap(monkeypatch, ops_registered) -> None:
    install(monkeypatch, "fake_ts", FakeVarlen(sinks=True))
    ops_registered.add("flash_attn_3")
    a = load_fa3((_build("tokenspeed-fa3", "fake_ts", "flash_attn_3", SOFTCAP=True),)).abi
    assert a is not None and a.sinks and not a.softcap and a.fp16


def test_mate_lookalike_is_refused(monkeypatch, ops_registered) -> None:
    # MATE's wrapper: module flash_attn_interface with an FA3-like signature, but no torch.ops.flash_attn_3
    install(monkeypatch, "fake_mate_fai", FakeVarlen(lse_flag="return_softmax_lse", sinks=True))
    got = load_fa3((_build("flash_attn_3", "fake_mate_fai", "flash_attn_3"),))
    assert got.abi is None
    assert "torch.ops.flash_attn_3.fwd is not registered" in got.why_none() and "MATE" in got.why_none()
    # ... and when its distribution (flash_attn_3 0.x) gives it away, it is never even imported
    mate = FoundBuild("mate", ("fake_never_imported",), "flash_attn_3", "flash_attn_3", "0.2.2", refusal="MATE wrapper")
    monkeypatch.setitem(sys.modules, "fake_never_imported", None)  # importing it would raise
    assert load_fa3((mate,)).why_none() == "MATE wrapper"


def test_preference_order_falls_through_with_reasons(monkeypatch, ops_registered) -> None:
    monkeypatch.setitem(sys.modules, "fake_broken_fwd", None)  # import raises ImportError
    install(monkeypatch, "fake_up2", FakeVarlen())
    ops_registered.add("flash_attn_3")
    got = load_fa3((_build("fa3-fwd", "fake_broken_fwd"), _build("flash_attn_3", "fake_up2", "flash_attn_3")))
    assert got.abi is not None and got.abi.module == "fake_up2"
    assert len(got.attempts) == 1 and "fake_broken_fwd" in got.attempts[0] and "ModuleNotFoundError" in got.attempts[0]


# ---------------------------------------------------------------------------------------------
# the call: exactly what is passed and returned
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_sinks", [0, 1, 2])
@pytest.mark.parametrize("rescale", ["fp32", "activation"])
def test_fa3_fwd_call_passes_keywords_and_corrects_sinks(monkeypatch, ops_registered, n_sinks, rescale) -> None:
    fake = FakeVarlen()
    p = _provider(monkeypatch, ops_registered, fake, _build())
    for seed in (0, 1):
        q, k, v, cu, mx, sinks = _inputs(seed, [0, 5, 5, 19], n_sinks=n_sinks)
        sinks_before = None if sinks is None else sinks.clone()
        o, lse = _call(p, q, k, v, cu, mx, sinks, softcap=-1.0, rescale=rescale)
        call = fake.calls[-1]
        assert set(call) == {
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
            "num_splits",
            "return_attn_probs",
        }
        assert call["q"] is q and call["cu_seqlens_q"] is cu and call["max_seqlen_k"] == mx
        assert (call["softcap"], call["causal"], call["num_splits"], call["softmax_scale"]) == (0.0, False, 1, SCALE)
        # returned: FA3's out/LSE corrected exactly as the reference correction does it
        raw_o, raw_lse = fake._impl({**call})[:2]
        want_o, want_lse = sink_correction(raw_o, raw_lse, sinks, rescale=rescale)
        assert torch.equal(o, want_o) and torch.equal(lse, want_lse)
        ro, rlse = _ref(q, k, v, cu, mx, sinks, rescale=rescale)
        assert accept_attention(o, ro) and accept_lse(lse, rlse, q.dtype)
        if sinks is not None:
            assert torch.equal(sinks, sinks_before) and sinks.dtype == torch.float32


def test_output_only_call_requests_no_lse(monkeypatch, ops_registered) -> None:
    fake = FakeVarlen()
    p = _provider(monkeypatch, ops_registered, fake, _build())
    q, k, v, cu, mx, _ = _inputs(2, [0, 9, 16], n_sinks=0)
    o, lse = _call(p, q, k, v, cu, mx, None, softcap=1.5, return_lse=False)
    assert lse is None and "return_attn_probs" not in fake.calls[-1] and fake.calls[-1]["softcap"] == 1.5
    assert torch.equal(o, _ref(q, k, v, cu, mx, None, softcap=1.5)[0])


def test_tokenspeed_native_sink_only_where_it_meets_the_contract(monkeypatch, ops_registered) -> None:
    fake = FakeVarlen(sinks=True)
    p = _provider(monkeypatch, ops_registered, fake, _build("tokenspeed-fa3", "fake_ts2", "flash_attn_3", SOFTCAP=True))
    q, k, v, cu, mx, sinks = _inputs(3, [0, 7, 20], n_sinks=1)
    o, lse = _call(p, q, k, v, cu, mx, sinks, return_lse=False)
    call = fake.calls[-1]
    assert lse is None and "return_attn_probs" not in call and call["softcap"] == 0.0
    assert call["sinks"].shape == (4,) and call["sinks"].dtype == torch.float32 and torch.equal(call["sinks"], sinks[0])
    assert torch.equal(o, _ref(q, k, v, cu, mx, sinks)[0])  # the fake's native sink = the exact reference
    # two sink rows, the LSE requested, or the activation-dtype rescale: no native sinks, LSE + correction
    for n_sinks, want_lse, rescale in ((2, False, "fp32"), (1, True, "fp32"), (1, False, "activation")):
        q, k, v, cu, mx, sinks = _inputs(4, [0, 7, 20], n_sinks=n_sinks)
        o, lse = _call(p, q, k, v, cu, mx, sinks, rescale=rescale, return_lse=want_lse)
        call = fake.calls[-1]
        assert "sinks" not in call and call["return_attn_probs"] is True
        raw_o, raw_lse = fake._impl({**call})[:2]
        assert torch.equal(o, sink_correction(raw_o, raw_lse, sinks, rescale=rescale)[0])
        assert (lse is not None) == want_lse


def test_softcap_on_a_build_without_it(monkeypatch, ops_registered) -> None:
    fake = FakeVarlen(sinks=True)
    p = _provider(monkeypatch, ops_registered, fake, _build("tokenspeed-fa3", "fake_ts3", "flash_attn_3", SOFTCAP=True))
    prob = Problem(op="attention", device_type="cuda", dtype="bfloat16", features=frozenset({Feature.SOFTCAP}))
    (reason,) = p.check(prob)
    assert reason.code == ReasonCode.FEATURE and reason.field == "softcap" and "compiled out" in reason.detail
    q, k, v, cu, mx, _ = _inputs(5, [0, 8], n_sinks=0)
    with pytest.raises(NotImplementedError, match="softcap"):
        _call(p, q, k, v, cu, mx, None, softcap=2.0)
    assert fake.calls == []  # refused before the kernel was called
    # a build whose function has no softcap keyword at all: same verdict, and a zero cap is simply omitted
    fake2 = FakeVarlen(softcap=False)
    p2 = _provider(monkeypatch, ops_registered, fake2, _build("flash_attn_3", "fake_nocap", "flash_attn_3"))
    assert "no softcap keyword" in p2.check(prob)[0].detail
    _call(p2, q, k, v, cu, mx, None)
    assert "softcap" not in fake2.calls[-1]


@pytest.mark.parametrize("bad", ["th", "tuple_missing"])
def test_wrong_lse_layout_is_an_error(monkeypatch, ops_registered, bad) -> None:
    fake = FakeVarlen(lse_layout="th" if bad == "th" else "ht")
    p = _provider(monkeypatch, ops_registered, fake, _build())
    if bad == "tuple_missing":  # a build that ignores the LSE flag and returns only out
        monkeypatch.setattr(fake, "lse_flag", "not_the_flag_passed")
    q, k, v, cu, mx, sinks = _inputs(6, [0, 3, 10])  # Tq=10 != Hq=4: the layouts are distinguishable
    with pytest.raises(RuntimeError, match=r"\[Hq, Tq\]" if bad == "th" else "expected a tuple"):
        _call(p, q, k, v, cu, mx, sinks)


def test_extra_outputs_are_ignored_and_failures_propagate(monkeypatch, ops_registered) -> None:
    fake = FakeVarlen(extra_outputs=2)  # sglang-style (out, lse, *rest)
    p = _provider(monkeypatch, ops_registered, fake, _build())
    q, k, v, cu, mx, sinks = _inputs(7, [0, 11])
    _o, lse = _call(p, q, k, v, cu, mx, sinks)
    assert lse is not None and lse.shape == (4, 11)

    fake.error = RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _call(p, q, k, v, cu, mx, sinks)


# ---------------------------------------------------------------------------------------------
# check(): availability reasons
# ---------------------------------------------------------------------------------------------
def _problem(dtype: str = "bfloat16", *features: Feature) -> Problem:
    return Problem(op="attention", device_type="cuda", dtype=dtype, features=frozenset(features))


def test_check_reasons(monkeypatch, ops_registered) -> None:
    none = FA3Attention(loader=lambda: load_fa3(()), capability=lambda index: (9, 0))
    (r,) = none.check(_problem())
    assert r.code == ReasonCode.UNAVAILABLE and "no FA3 build installed" in r.detail
    fake = FakeVarlen()
    build = _build(FP16=True, SM8x=True)
    assert _provider(monkeypatch, ops_registered, fake, build, cc=(9, 0)).check(_problem()) == []
    (r,) = _provider(monkeypatch, ops_registered, fake, build, cc=None).check(_problem())
    assert (r.code, r.field) == (ReasonCode.UNAVAILABLE, "cuda") and "fa3-fwd" in r.detail
    for cc in ((8, 0), (10, 0), (7, 5)):
        (r,) = _provider(monkeypatch, ops_registered, fake, build, cc=cc).check(_problem())
        assert (r.field, r.expected, r.actual) == ("compute_capability", "9.x", f"{cc[0]}.{cc[1]}")
    assert _provider(monkeypatch, ops_registered, fake, _build(), cc=(8, 0)).check(_problem()) == []  # SM8x built
    (r,) = _provider(monkeypatch, ops_registered, fake, build).check(_problem("float16"))
    assert r.code == ReasonCode.DTYPE and "FLASHATTENTION_DISABLE_FP16" in r.detail
    assert _provider(monkeypatch, ops_registered, fake, _build()).check(_problem("float16", Feature.SOFTCAP)) == []


def test_check_on_a_described_device_judges_its_capability_and_says_what_it_assumed(
    monkeypatch, ops_registered
) -> None:
    """``magi2 explain --device-name``: no device and no FA3 build here, yet FA3 is judged on that device."""
    hopper, blackwell = VirtualDevice(type="cuda", capability="9.0"), VirtualDevice(type="cuda", capability="10.0")
    none = FA3Attention(loader=lambda: load_fa3(()), capability=lambda index: None)
    reasons, (note,) = none.check_on(_problem("float16", Feature.SOFTCAP), hopper)
    assert reasons == () and "no FA3 build imports here" in note and "sm90a" in note
    (r,), _ = none.check_on(_problem(), blackwell)
    assert (r.code, r.field, r.expected, r.actual) == (ReasonCode.CHECK, "compute_capability", "9.x", "10.0")
    (r,), _ = none.check_on(_problem(), VirtualDevice(type="cuda", name="NVIDIA H999"))
    assert (r.field, r.actual) == ("compute_capability", "unknown")
    # a build that imports here is judged as it is (its flags), whatever this host's device is
    built = _provider(monkeypatch, ops_registered, FakeVarlen(), _build(FP16=True), cc=None)
    (r,), (note,) = built.check_on(_problem("float16"), hopper)
    assert r.code == ReasonCode.DTYPE and "this host's build, fa3-fwd 9.9.9" in note
    assert built.check_on(_problem(), VirtualDevice(type="cuda", capability="8.0")).reasons == ()  # SM8x built


def test_without_cuda_the_real_provider_reports_cleanly() -> None:
    from magi2_backend_cuda_fa3.provider import fa3_attention

    reasons = fa3_attention.check(_problem())
    if torch.cuda.is_available() and fa3_attention.loaded.abi is not None:
        pytest.skip("a usable FA3 build and CUDA are present")
    assert reasons and reasons[0].code == ReasonCode.UNAVAILABLE


# ---------------------------------------------------------------------------------------------
# the sink correction choice is a value
# ---------------------------------------------------------------------------------------------
TRITON_MODULE = "magi2_backend_triton.sink_correction"


def test_sink_correction_choice(monkeypatch) -> None:
    # FA3 asks the core for CUDA's correction: the Triton backend contributes the fused kernel there.
    pytest.importorskip("triton")
    chosen = sink_correction_for("cuda")
    assert chosen.name == "triton" and TRITON_MODULE in chosen.detail
    assert FA3Attention().sink_correction is chosen
    monkeypatch.setitem(sys.modules, TRITON_MODULE, None)
    m2.reload_config()  # a new configuration generation: the choice is made again
    fallback = sink_correction_for("cuda")
    assert fallback.name == "torch" and TRITON_MODULE in fallback.detail
    monkeypatch.delitem(sys.modules, TRITON_MODULE)
    m2.reload_config()


def test_torch_correction_is_the_core_reference() -> None:
    g = torch.Generator().manual_seed(8)
    o = torch.randn(9, 3, 16, generator=g).bfloat16()
    lse = torch.randn(3, 9, generator=g) * 3
    lse[0, 0] = -math.inf
    sinks = torch.randn(2, 3, generator=g)
    got_o, got_lse = torch_correction("t").apply(o, lse, sinks, rescale="activation", return_lse=True)
    want_o, want_lse = sink_correction(o, lse, sinks, rescale="activation")
    assert torch.equal(got_o, want_o) and torch.equal(got_lse, want_lse) and got_o[0, 0].abs().sum() == 0
    assert torch_correction("t").apply(o, lse, sinks, rescale="fp32", return_lse=False)[1] is None


# ---------------------------------------------------------------------------------------------
# descriptor and rules
# ---------------------------------------------------------------------------------------------
def test_descriptor_from_packaging_only() -> None:
    cap = descriptor(None)
    assert (cap.op, cap.name, cap.priority, cap.device_types) == ("attention", "fa3", 30, ("cuda",))
    assert set(cap.dtypes) == {"bfloat16", "float16"} and "no FA3 build" in cap.version
    assert {Feature.SOFTCAP, Feature.SINKS, Feature.GQA, Feature.LSE} <= cap.features
    assert cap.head_dims == tuple(range(8, 257, 8))
    build = _build(HDIM256=True, HDIM192=True)
    assert head_dims(build)[-1] == 128 and "fa3-fwd 9.9.9" in descriptor(build).version
    spec = magi2_backend()
    assert spec.name == "magi2-backend-cuda-fa3" and spec.providers[0].name == "fa3"


def test_descriptor_says_what_fa3_can_serve_and_nothing_about_speed() -> None:
    # Speed choices (torch varlen on short work, FA4's native sink on short packs) are the device
    # profile's: a descriptor that vetoed them turned deterministic and GQA short work to the reference.
    assert descriptor(None).rules == () and descriptor(_build()).rules == ()


def test_h200_profile_prefers_torch_varlen_only_on_short_work_without_sinks() -> None:
    (h200,) = [f.profile for f in shipped_profiles() if f.profile.name == "nvidia-h200"]

    def prefers_varlen(tokens: int, max_k: int, heads: int = 24, *features: Feature) -> bool:
        p = Problem(
            op="attention",
            device_type="cuda",
            dtype="bfloat16",
            features=frozenset(features),
            tokens=tokens,
            tokens_k=tokens,
            max_seqlen_q=max_k,
            max_seqlen_k=max_k,
            num_heads_q=heads,
        )
        row = h200.preference_for(p)
        return row is not None and row.prefer[0] == "torch_varlen"

    assert prefers_varlen(342, 300) and prefers_varlen(1024, 1024) and prefers_varlen(2048, 1024)
    assert prefers_varlen(4096, 256) and prefers_varlen(16384, 64)
    assert not prefers_varlen(1536, 1536) and not prefers_varlen(2048, 2048)  # single segments: a toss-up, FA3 kept
    assert not prefers_varlen(2049, 1024) and not prefers_varlen(4096, 512) and not prefers_varlen(8192, 1024)
    assert not prefers_varlen(4096, 4096) and not prefers_varlen(32768, 32768)
    assert not prefers_varlen(342, 300, 24, Feature.SINKS) and not prefers_varlen(342, 300, 48)
    rows = [r for r in h200.preferences if r.prefer[0] == "torch_varlen"]
    for row in rows:  # provenance names a committed results file
        assert row.provenance is not None and row.provenance.kind == "benchmark"
        assert (REPO / row.provenance.source).is_file()


def test_public_resolution_on_cpu_rejects_fa3_by_device(registered) -> None:
    q, k, v, cu, _mx, sinks = _inputs(9, [0, 6, 12], dtype=torch.float32)
    res = m2.resolve("attention", q, k, v, cu, cu, sinks=sinks)
    fa3 = next(c for c in res.candidates if c.provider == "fa3")
    assert fa3.reasons[0].code == ReasonCode.DEVICE_TYPE


# ---------------------------------------------------------------------------------------------
# upstream's sink kinds (normal, large, -inf, +inf, all -inf), both rescale modes, with the LSE
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize(
    ("build", "rescale", "return_lse"),
    [
        ("fa3-fwd", "fp32", True),
        ("fa3-fwd", "activation", True),
        ("tokenspeed-fa3", "fp32", False),
        ("tokenspeed-fa3", "activation", True),
    ],
    ids=["fwd-fp32", "fwd-activation", "tokenspeed-native", "tokenspeed-activation"],
)
@pytest.mark.parametrize("kind", SINK_KINDS)
def test_upstream_sink_kinds(monkeypatch, ops_registered, kind, build, rescale, return_lse, n_sinks) -> None:
    native = build == "tokenspeed-fa3"
    fake = FakeVarlen(sinks=native)
    found = _build(
        build, f"fake_kinds_{build.replace('-', '_')}", "flash_attn_3" if native else "fa3_fwd", SOFTCAP=native
    )
    p = _provider(monkeypatch, ops_registered, fake, found)
    q, k, v, cu, mx, _ = _inputs(8, [0, 9, 9, 31], n_sinks=0)
    sinks = sink_logits(kind, n_sinks, 4, torch.Generator().manual_seed(n_sinks))
    o, lse = _call(p, q, k, v, cu, mx, sinks, rescale=rescale, return_lse=return_lse)
    assert ("sinks" in fake.calls[-1]) == (native and n_sinks == 1 and rescale == "fp32" and not return_lse)
    ro, rlse = _ref(q, k, v, cu, mx, sinks, rescale=rescale)
    assert accept_attention(o, ro), accept_attention(o, ro)
    if return_lse:
        assert accept_lse(lse, rlse, q.dtype), accept_lse(lse, rlse, q.dtype)
    plain_o, plain_lse = _call(p, q, k, v, cu, mx, None, return_lse=return_lse)
    assert oracles.sink_kind_violations(o, lse, sinks, plain_o, plain_lse) == []
