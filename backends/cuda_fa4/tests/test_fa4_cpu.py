"""CPU tests of the FA4 provider with a fake ``flash_attn.cute``: loading, what is passed and returned,
the contract's non-finite sink rules, and resolution on a fake Hopper and a fake Blackwell device."""

from __future__ import annotations

import itertools
import math
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from fa4_fakes import FakeFA4, install
from magi2_backend_cuda_fa3 import plugin as fa3_plugin
from magi2_backend_cuda_fa3.abi import FA3Abi
from magi2_backend_cuda_fa3.abi import LoadResult as FA3LoadResult
from magi2_backend_cuda_fa3.discovery import FoundBuild
from magi2_backend_cuda_fa3.provider import FA3Attention
from magi2_backend_cuda_fa4 import abi as abi_mod
from magi2_backend_cuda_fa4 import discovery
from magi2_backend_cuda_fa4.abi import REQUIRED_KEYWORDS, FA4Abi, LoadResult, load_fa4
from magi2_backend_cuda_fa4.discovery import FA4Install
from magi2_backend_cuda_fa4.native_sinks import native_sink
from magi2_backend_cuda_fa4.plugin import HEAD_DIMS, descriptor, magi2_backend
from magi2_backend_cuda_fa4.provider import FA4Attention
from magi2_backend_reference.attention import reference_attention
from magi2_backend_reference.plugin import PROVIDERS as REFERENCE_PROVIDERS

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_attention, accept_lse
from magi2_core.model import devices
from magi2_core.model.problem import Feature, Problem
from magi2_core.model.virtual_device import VirtualDevice
from magi2_core.profiles import Profile, reset_profiles, shipped_profiles
from magi2_core.reasons import ReasonCode
from magi2_core.selection.registry import Registry
from magi2_core.selection.resolver import resolve_problem
from magi2_core.sink_correction.choice import torch_correction
from magi2_core.sink_correction.reference import sink_correction
from magi2_core.testing import InProcessBackend, call_record
from magi2_core.testing.specials import SINK_KINDS, sink_logits

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests"))  # the float64 oracles live with the core tests of this monorepo
import oracles  # noqa: E402

INSTALL = FA4Install("4.0.0b36", "4.8.1")
D = 64
SCALE = D**-0.5
INF = math.inf


def _provider(
    monkeypatch: pytest.MonkeyPatch, fake: FakeFA4 | None, cc: tuple[int, int] | None = (9, 0)
) -> FA4Attention:
    module = install(monkeypatch, fake)
    return FA4Attention(
        loader=lambda: load_fa4(module, INSTALL), correction=lambda: torch_correction("test"), capability=lambda *_: cc
    )


def _inputs(
    seed: int,
    cu_q: list[int],
    cu_k: list[int] | None = None,
    hq: int = 4,
    hkv: int = 2,
    n_sinks: int = 1,
    dtype: torch.dtype = torch.bfloat16,
):
    cu_k = cu_q if cu_k is None else cu_k
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(cu_q[-1], hq, D, generator=g).to(dtype)
    k = torch.randn(cu_k[-1], hkv, D, generator=g).to(dtype)
    v = torch.randn(cu_k[-1], hkv, D, generator=g).to(dtype)
    sinks = (torch.randn(n_sinks, hq, generator=g) * 2 + 2).float() if n_sinks else None
    cq, ck = torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)
    return q, k, v, cq, ck, sinks


def _max(cu: torch.Tensor) -> int:
    return max([b - a for a, b in itertools.pairwise(cu.tolist())], default=0)


def _record(q, k, v, cq, ck, sinks, *, softcap=0.0, rescale="fp32", return_lse=True):
    """The call record, with ``sinks`` as given: a device sinks tensor reaches a provider unchecked, NaN
    included (host sinks with NaN are refused by validation, so they are put in after it)."""
    call = call_record(
        "attention",
        q,
        k,
        v,
        cq,
        ck,
        max_seqlen_q=_max(cq),
        max_seqlen_k=_max(ck),
        softmax_scale=SCALE,
        softcap=softcap,
        sinks=None if sinks is None else torch.zeros_like(sinks),
        sink_rescale=rescale,
        deterministic=False,
        return_lse=return_lse,
    )
    return call._replace(sinks=call.sinks if sinks is None or call.sinks is None else sinks)


def _call(p: FA4Attention, q, k, v, cq, ck, sinks, *, softcap=0.0, rescale="fp32", return_lse=True):
    return p(_record(q, k, v, cq, ck, sinks, softcap=softcap, rescale=rescale, return_lse=return_lse))


def _ref(q, k, v, cq, ck, sinks, *, softcap=0.0, rescale="fp32"):
    return reference_attention(_record(q, k, v, cq, ck, sinks, softcap=softcap, rescale=rescale))


# ---------------------------------------------------------------------------------------------
# discovery and loading
# ---------------------------------------------------------------------------------------------
def test_installed_from_packaging_only(monkeypatch) -> None:
    versions: dict[str, str] = {}
    monkeypatch.setattr(discovery, "dist_version", lambda name: versions.get(name))
    assert discovery.installed() is None
    versions["flash-attn-4"] = "4.0.0b36"
    assert discovery.installed() == FA4Install("4.0.0b36", None)
    versions["nvidia-cutlass-dsl"] = "4.8.1"
    assert discovery.installed().label == "flash-attn-4 4.0.0b36 (nvidia-cutlass-dsl 4.8.1)"


def test_load_reasons(monkeypatch) -> None:
    monkeypatch.setattr(abi_mod, "installed", lambda: None)
    assert "flash-attn-4 is not installed" in load_fa4("fake_never_imported").why_none()
    monkeypatch.setitem(sys.modules, "fake_broken_cute", None)  # importing it raises
    monkeypatch.setattr(abi_mod, "dist_version", lambda name: "2.8.3" if name == "flash-attn" else None)
    why = load_fa4("fake_broken_cute", INSTALL).why_none()
    assert "import fake_broken_cute" in why and "ModuleNotFoundError" in why and "flash-attn 2.8.3" in why
    assert "no flash_attn_varlen_func" in load_fa4(install(monkeypatch, None, "fake_empty_cute"), INSTALL).why_none()
    old = types.ModuleType("fake_old_cute")
    old.flash_attn_varlen_func = lambda q, k, v, cu_seqlens_q=None, softcap=0.0: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_old_cute", old)
    why = load_fa4("fake_old_cute", INSTALL).why_none()
    assert "learnable_sink" in why and "return_lse" in why and "softcap," not in why
    got = load_fa4(install(monkeypatch, FakeFA4()), INSTALL)
    assert got.abi is not None and got.error is None
    assert got.abi.label == "flash-attn-4 4.0.0b36 (nvidia-cutlass-dsl 4.8.1) (fake_flash_attn_cute)"


def test_the_fake_carries_the_real_keywords() -> None:
    import inspect

    params = list(inspect.signature(FakeFA4().flash_attn_varlen_func).parameters)
    assert params[:4] == ["q", "k", "v", "qv"]  # positional cu_seqlens_q would land on qv: keywords only
    assert set(REQUIRED_KEYWORDS) <= set(params)


# ---------------------------------------------------------------------------------------------
# the call: exactly what is passed and returned
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_sinks", [0, 1, 2])
@pytest.mark.parametrize("return_lse", [True, False])
@pytest.mark.parametrize(("softcap", "hkv"), [(0.0, 4), (-1.0, 2), (1.5, 1)], ids=["mha", "cap-1-gqa2", "cap1.5-gqa4"])
def test_native_sinks_softcap_gqa_lse(monkeypatch, n_sinks, return_lse, softcap, hkv) -> None:
    fake = FakeFA4()
    p = _provider(monkeypatch, fake)
    for seed in (0, 1):
        q, k, v, cq, ck, sinks = _inputs(seed, [0, 5, 5, 19], [0, 7, 7, 30], hkv=hkv, n_sinks=n_sinks)
        sinks_before = None if sinks is None else sinks.clone()
        o, lse = _call(p, q, k, v, cq, ck, sinks, softcap=softcap, return_lse=return_lse)
        call = fake.calls[-1]
        assert call["q"] is q and call["cu_seqlens_q"] is cq and call["cu_seqlens_k"] is ck and call["qv"] is None
        assert (call["max_seqlen_q"], call["max_seqlen_k"], call["softmax_scale"]) == (14, 23, SCALE)
        assert (call["causal"], call["num_splits"], call["softcap"]) == (False, 1, max(softcap, 0.0))
        assert call["return_lse"] is return_lse  # native sinks: no LSE is needed to apply them
        if sinks is None:
            assert call["learnable_sink"] is None
        else:  # one FP32 logit per head: Ls = logsumexp_n sinks[n]
            ls = call["learnable_sink"]
            assert ls.shape == (4,) and ls.dtype == torch.float32 and ls.is_contiguous()
            assert torch.equal(ls, torch.logsumexp(sinks, dim=0)) if n_sinks > 1 else torch.equal(ls, sinks[0])
            assert torch.equal(sinks, sinks_before)
        ro, rlse = _ref(q, k, v, cq, ck, sinks, softcap=max(softcap, 0.0))
        assert accept_attention(o, ro) and o.dtype == q.dtype
        if return_lse:  # the LSE includes the sinks
            assert lse.shape == (4, 19) and lse.dtype == torch.float32 and accept_lse(lse, rlse, q.dtype)
        else:
            assert lse is None


def test_softcap_never_touches_the_sink(monkeypatch) -> None:
    # a sink logit far above the cap: were it capped too, its weight would collapse and the output grow
    p = _provider(monkeypatch, FakeFA4())
    q, k, v, cq, ck, _ = _inputs(2, [0, 9, 20], hkv=4, n_sinks=0)
    sinks = torch.full((1, 4), 6.0)
    o, lse = _call(p, q, k, v, cq, ck, sinks, softcap=1.0)
    ro, rlse = _ref(q, k, v, cq, ck, sinks, softcap=1.0)
    assert accept_attention(o, ro) and accept_lse(lse, rlse, q.dtype)
    capped_sink = torch.full((1, 4), 1.0 * math.tanh(6.0 / 1.0))
    assert not accept_attention(o, _ref(q, k, v, cq, ck, capped_sink, softcap=1.0)[0])


@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize("return_lse", [True, False])
def test_activation_rescale_runs_without_the_sink_then_corrects(monkeypatch, n_sinks, return_lse) -> None:
    fake = FakeFA4()
    p = _provider(monkeypatch, fake)
    q, k, v, cq, ck, sinks = _inputs(3, [0, 7, 7, 20], n_sinks=n_sinks)
    o, lse = _call(p, q, k, v, cq, ck, sinks, rescale="activation", return_lse=return_lse)
    call = fake.calls[-1]
    assert call["learnable_sink"] is None and call["return_lse"] is True
    raw_o, raw_lse = fake.flash_attn_varlen_func(**call)
    want_o, want_lse = sink_correction(raw_o, raw_lse, sinks, rescale="activation")
    assert torch.equal(o, want_o) and (torch.equal(lse, want_lse) if return_lse else lse is None)
    ro, _ = _ref(q, k, v, cq, ck, sinks, rescale="activation")
    assert accept_attention(o, ro)


# ---------------------------------------------------------------------------------------------
# non-finite sinks and empty segments: the contract's answer (magi2_core.sink_correction.reference rules)
# ---------------------------------------------------------------------------------------------
def _non_finite_sinks() -> torch.Tensor:
    # heads: NaN, +inf, all -inf (no sink mass), finite; a second row mixes -inf and finite
    return torch.tensor([[math.nan, INF, -INF, 1.5], [0.5, 2.0, -INF, -INF]])


@pytest.mark.parametrize("n_sinks", [1, 2])
def test_non_finite_sinks_and_empty_segments_match_the_contract(monkeypatch, n_sinks) -> None:
    fake = FakeFA4()
    p = _provider(monkeypatch, fake)
    # an empty query segment, and a query segment whose key segment is empty (rows without keys)
    q, k, v, cq, ck, _ = _inputs(4, [0, 6, 6, 11, 20], [0, 8, 13, 13, 25], n_sinks=0)
    sinks = _non_finite_sinks()[:n_sinks].contiguous()
    o, lse = _call(p, q, k, v, cq, ck, sinks)
    logit = fake.calls[-1]["learnable_sink"]
    assert torch.isposinf(logit[0]) and not torch.isnan(logit).any()  # NaN reaches FA4 as +inf
    ro, rlse = _ref(q, k, v, cq, ck, sinks)
    assert accept_attention(o, ro), accept_attention(o, ro)
    assert accept_lse(lse, rlse, q.dtype), accept_lse(lse, rlse, q.dtype)  # NaN/inf where the reference has them
    assert torch.isnan(lse[0]).all() == (n_sinks == 1 or bool(torch.isnan(sinks[:, 0]).any()))
    assert torch.equal(o[6:11], torch.zeros_like(o[6:11]))  # rows without keys
    # the fake behaves like FA4 here: given the NaN sink itself, the output is not the contract's zero
    raw_o, _ = fake.flash_attn_varlen_func(**{**fake.calls[-1], "learnable_sink": native_sink(sinks).exact})
    assert raw_o[:6, 0].abs().sum() > 0 and o[:6, 0].abs().sum() == 0


@pytest.mark.parametrize("empty", ["no-keys", "no-queries"])
@pytest.mark.parametrize("n_sinks", [0, 1])
def test_a_call_without_keys_or_queries(monkeypatch, empty, n_sinks) -> None:
    p = _provider(monkeypatch, FakeFA4())
    cu_q, cu_k = ([0, 3, 7], [0, 0, 0]) if empty == "no-keys" else ([0, 0, 0], [0, 4, 9])
    q, k, v, cq, ck, _ = _inputs(5, cu_q, cu_k, n_sinks=0)
    sinks = _non_finite_sinks()[:1] if n_sinks else None
    o, lse = _call(p, q, k, v, cq, ck, sinks)
    ro, rlse = _ref(q, k, v, cq, ck, sinks)
    assert o.shape == q.shape and lse.shape == (4, cu_q[-1])
    assert torch.equal(o, ro) and accept_lse(lse, rlse, q.dtype), accept_lse(lse, rlse, q.dtype)


# ---------------------------------------------------------------------------------------------
# what comes back
# ---------------------------------------------------------------------------------------------
def test_heads_minor_lse_is_normalised(monkeypatch) -> None:
    q, k, v, cq, ck, sinks = _inputs(6, [0, 3, 10])  # Tq=10 != Hq=4: the layouts are distinguishable
    o1, lse1 = _call(_provider(monkeypatch, FakeFA4()), q, k, v, cq, ck, sinks)
    o2, lse2 = _call(_provider(monkeypatch, FakeFA4(lse_layout="th")), q, k, v, cq, ck, sinks)
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2) and lse2.is_contiguous()


def test_wrong_results_are_errors_and_failures_propagate(monkeypatch) -> None:
    fake = FakeFA4()
    q, k, v, cq, ck, sinks = _inputs(7, [0, 11])
    real = fake.flash_attn_varlen_func
    cases: list[tuple[Any, str]] = [
        (lambda **kw: real(**kw)[0], "expected the pair"),
        (lambda **kw: (real(**kw)[0], real(**kw)[1][:, :5]), r"expected \[Hq, Tq\]"),
        (lambda **kw: (real(**kw)[0], real(**kw)[1].double()), "expected torch.float32"),
        (lambda **kw: (real(**kw)[0].float(), real(**kw)[1]), "returned out"),
    ]
    for fn, match in cases:
        p = FA4Attention(loader=lambda fn=fn: LoadResult(FA4Abi(INSTALL, "fake", fn)), capability=lambda *_: (9, 0))
        with pytest.raises(RuntimeError, match=match):
            _call(p, q, k, v, cq, ck, sinks)
    p = _provider(monkeypatch, fake)
    fake.error = RuntimeError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(RuntimeError, match="illegal memory access"):
        _call(p, q, k, v, cq, ck, sinks)


# ---------------------------------------------------------------------------------------------
# check(): availability reasons
# ---------------------------------------------------------------------------------------------
def _problem(dtype: str = "bfloat16", *features: Feature) -> Problem:
    return Problem(op="attention", device_type="cuda", dtype=dtype, features=frozenset(features))


def test_check_reasons(monkeypatch) -> None:
    none = FA4Attention(loader=lambda: LoadResult(None, "flash-attn-4 is not installed"), capability=lambda *_: (9, 0))
    (r,) = none.check(_problem())
    assert (r.code, r.field) == (ReasonCode.UNAVAILABLE, "fa4") and "not installed" in r.detail
    (r,) = _provider(monkeypatch, FakeFA4(), cc=None).check(_problem())
    assert (r.code, r.field) == (ReasonCode.UNAVAILABLE, "cuda") and "flash-attn-4 4.0.0b36" in r.detail
    for cc in ((8, 0), (11, 0), (12, 0), (7, 5)):
        (r,) = _provider(monkeypatch, FakeFA4(), cc=cc).check(_problem())
        assert (r.code, r.field, r.expected, r.actual) == (
            ReasonCode.CHECK,
            "compute_capability",
            "9.x | 10.x",
            f"{cc[0]}.{cc[1]}",
        )
    for cc in ((9, 0), (10, 0), (10, 3)):
        assert _provider(monkeypatch, FakeFA4(), cc=cc).check(_problem("float16", *Feature)) == []


def test_check_on_a_described_device_judges_its_capability_and_says_what_it_assumed(monkeypatch) -> None:
    """``magi2 explain --device-name``: flash-attn-4 absent here is assumed installed on that device."""
    none = FA4Attention(loader=lambda: LoadResult(None, "flash-attn-4 is not installed"), capability=lambda *_: None)
    for cc in ("9.0", "10.0"):
        reasons, (note,) = none.check_on(_problem(), VirtualDevice(type="cuda", capability=cc))
        assert reasons == () and "flash-attn-4 does not import here" in note and "assumed installed" in note
    (r,), _ = none.check_on(_problem(), VirtualDevice(type="cuda", capability="12.0"))
    assert (r.code, r.field, r.expected, r.actual) == (ReasonCode.CHECK, "compute_capability", "9.x | 10.x", "12.0")
    (r,), _ = none.check_on(_problem(), VirtualDevice(type="cuda"))
    assert (r.field, r.actual) == ("compute_capability", "unknown")
    reasons, (note,) = _provider(monkeypatch, FakeFA4(), cc=None).check_on(
        _problem(), VirtualDevice(type="cuda", capability="10.0")
    )
    assert reasons == () and "this host's build, flash-attn-4 4.0.0b36" in note


def test_without_cuda_the_real_provider_reports_cleanly() -> None:
    from magi2_backend_cuda_fa4.provider import fa4_attention

    reasons = fa4_attention.check(_problem())
    if torch.cuda.is_available() and fa4_attention.loaded.abi is not None:
        pytest.skip("a usable FA4 build and CUDA are present")
    assert reasons and reasons[0].code == ReasonCode.UNAVAILABLE


# ---------------------------------------------------------------------------------------------
# descriptors and rules
# ---------------------------------------------------------------------------------------------
def test_descriptor_from_packaging_only() -> None:
    cap = descriptor(None)
    assert (cap.op, cap.name, cap.priority, cap.device_types) == ("attention", "fa4", 25, ("cuda",))
    assert set(cap.dtypes) == {"bfloat16", "float16"} and "flash-attn-4 not installed" in cap.version
    attention_features = frozenset(Feature) - {Feature.ROUTE_SOFTMAX, Feature.ROUTE_NO_NORM}
    assert cap.features == attention_features and cap.ranges == ()
    assert cap.head_dims == HEAD_DIMS == tuple(range(8, 129, 8))
    assert "flash-attn-4 4.0.0b36 (nvidia-cutlass-dsl 4.8.1)" in descriptor(INSTALL).version
    spec = magi2_backend()
    assert spec.name == "magi2-backend-cuda-fa4" and spec.providers[0].name == "fa4"


def _h200() -> Profile:
    (h200,) = [f.profile for f in shipped_profiles() if f.profile.name == "nvidia-h200"]
    return h200


def _preferred(tokens: int, max_k: int, heads: int = 24, *features: Feature, head_dim: int = 128) -> str | None:
    """The first provider the H200 profile prefers for this attention call (None: no row matches)."""
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
        head_dim=head_dim,
    )
    row = _h200().preference_for(p)
    return None if row is None else row.prefer[0]


def test_descriptors_carry_no_speed_rules() -> None:
    # FA4 used to copy FA3's short-work corners and FA3 to stand aside for FA4's sink: speed, not
    # correctness; both are preferences of the device profile now.
    assert descriptor(INSTALL).rules == () and fa3_plugin.descriptor(None).rules == ()


def test_h200_profile_short_work_without_sinks_or_softcap_prefers_torch_varlen() -> None:
    assert _preferred(342, 342) == "torch_varlen" and _preferred(4096, 256) == "torch_varlen"
    assert _preferred(4096, 4096) is None and _preferred(8192, 1024) is None
    assert _preferred(342, 342, 48) is None
    assert _preferred(342, 342, 24, Feature.SOFTCAP) == "torch_varlen"  # which cannot serve it: the next one does


def test_h200_profile_prefers_fa4_sinks_on_short_packs_only() -> None:
    shorts = {
        "16x256": (4096, 256),
        "8x1024": (8192, 1024),
        "[342]": (342, 342),
        "[1024]": (1024, 1024),
        "[4096]": (4096, 4096),
        "2x2048": (4096, 2048),
    }
    longs = {"[32768]": (32768, 32768), "[8192]x4": (32768, 8192), "[14601]x2": (29202, 14601), "[8192]": (8192, 8192)}
    for t, mk in shorts.values():
        assert _preferred(t, mk, 24, Feature.SINKS) == "fa4" == _preferred(t, mk, 24, Feature.SINKS, Feature.SOFTCAP)
        assert _preferred(t, mk, 24) != "fa4" and _preferred(t, mk, 32, Feature.SINKS) is None
    for t, mk in longs.values():
        assert _preferred(t, mk, 24, Feature.SINKS) is None
    for row in _h200().preferences:
        if row.prefer[0] == "fa4":  # the sweep that re-measures them writes the file they name
            assert row.provenance is not None and row.provenance.kind == "benchmark"
            assert row.provenance.source == "benchmarks/results/attention_fa4_h200.json"
            assert row.provenance.source in (REPO / "benchmarks/attention_fa4.py").read_text()


@pytest.mark.parametrize(
    ("modules", "dists", "expected"),
    [
        ({"magi2_backend_cuda_fa4"}, {"flash-attn-4": "4.0.0b36"}, True),
        ({"magi2_backend_cuda_fa4"}, {}, False),
        (set(), {"flash-attn-4": "4.0.0b36"}, False),
    ],
)
def test_fa3_sees_fa4_from_packaging(monkeypatch, modules, dists, expected) -> None:
    from magi2_backend_cuda_fa3 import discovery as fa3_discovery

    monkeypatch.setattr(fa3_discovery, "_module_exists", lambda name: name in modules)
    monkeypatch.setattr(fa3_discovery, "dist_version", lambda name: dists.get(name))
    assert fa3_discovery.fa4_installed() is expected


# ---------------------------------------------------------------------------------------------
# resolution on a fake Hopper (cc 9.0) and a fake Blackwell (cc 10.0): descriptors + check()
# ---------------------------------------------------------------------------------------------
class _Runs:
    """A kernel object that can run anywhere (torch_varlen on a real CUDA device)."""

    def check(self, problem: Problem) -> list[Any]:
        return []


HOST = "fake_fa4_resolution_host"
DEVICES = {(9, 0): "NVIDIA H200", (10, 0): "NVIDIA B200"}  # the H200 has a shipped profile, the B200 none


@pytest.fixture(autouse=True)
def _fresh_profiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no user profile of this machine
    reset_profiles()
    yield
    reset_profiles()


def _world(monkeypatch, cc: tuple[int, int], *, fa4_usable: bool = True, fa4_installed: bool = True) -> Registry:
    name = DEVICES[cc]
    monkeypatch.setattr(
        devices,
        "device_identity",
        lambda kind, index=None: (name, f"{cc[0]}.{cc[1]}") if kind == "cuda" else (None, None),
    )
    fa3_build = FoundBuild("fa3-fwd", ("fa3_fwd_interface",), "fa3_fwd", "fa3-fwd", "0.0.3")
    fa3_abi = FA3Abi(
        build=fa3_build,
        module="fa3_fwd_interface",
        varlen=lambda **kw: None,
        params=frozenset(),
        lse_flag="return_attn_probs",
        softcap=True,
        sinks=False,
        fp16=True,
        sm8x=False,
    )
    fa4 = FA4Attention(
        loader=lambda: (
            load_fa4(install(monkeypatch, FakeFA4()), INSTALL)
            if fa4_usable
            else LoadResult(None, "import flash_attn.cute: ImportError: libcuda.so.1")
        ),
        capability=lambda *_: cc,
    )
    host = types.ModuleType(HOST)
    host.fa3 = FA3Attention(loader=lambda: FA3LoadResult(fa3_abi, ()), capability=lambda *_: cc)  # type: ignore[attr-defined]
    host.fa4 = fa4  # type: ignore[attr-defined]
    host.runs = _Runs()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, HOST, host)
    caps = [
        c.model_copy(update={"impl": f"{HOST}:runs"}) if c.name == "torch_varlen" else c
        for c in REFERENCE_PROVIDERS
        if c.op == "attention" and c.name != "reference"
    ]  # the name is reserved
    caps.append(fa3_plugin.descriptor(fa3_build).model_copy(update={"impl": f"{HOST}:fa3"}))
    if fa4_installed:
        caps.append(descriptor(INSTALL).model_copy(update={"impl": f"{HOST}:fa4"}))
    reg = Registry(discover=False)
    reg.register(
        InProcessBackend(m2.BackendSpec(name="world", version="0", core_api=">=2.0,<3", providers=tuple(caps))),
        name="world",
    )
    return reg


def _resolve(reg: Registry, segments: list[int], *features: Feature, heads: int = 24, head_dim: int = 128) -> Any:
    p = Problem(
        op="attention",
        device_type="cuda",
        dtype="bfloat16",
        features=frozenset(features),
        tokens=sum(segments),
        tokens_k=sum(segments),
        max_seqlen_q=max(segments),
        max_seqlen_k=max(segments),
        num_segments=len(segments),
        head_dim=head_dim,
        num_heads_q=heads,
        num_heads_kv=heads,
    )
    return resolve_problem(p, registry=reg)


SHORT_PACKS = {
    "16x256": [256] * 16,
    "8x1024": [1024] * 8,
    "342": [342],
    "1024": [1024],
    "4096": [4096],
    "2x2048": [2048] * 2,
}
LONG_PACKS = {"32768": [32768], "8192x4": [8192] * 4, "14601x2": [14601] * 2}


def test_hopper_resolution(monkeypatch) -> None:
    reg = _world(monkeypatch, (9, 0))
    for segs in SHORT_PACKS.values():  # with a sink: FA4's native sink, as the H200 profile prefers
        res = _resolve(reg, segs, Feature.SINKS)
        assert res.chosen == "fa4" and res.decided_by == "profile", res.explain()
        assert res.preference is not None and res.preference.id.startswith("h200-fa4-sink-"), res.explain()
        assert res.profile is not None and res.profile.name == "nvidia-h200" and res.profile.source == "shipped"
        assert _resolve(reg, segs, Feature.SINKS, Feature.SOFTCAP, Feature.LSE).chosen == "fa4"
        assert _resolve(reg, segs, Feature.SINKS, heads=32).chosen == "fa3"  # beyond the measured heads
        assert _resolve(reg, segs, Feature.SINKS, head_dim=256).chosen == "fa3"  # beyond fa4's head dims
    for segs in LONG_PACKS.values():  # long: FA3 + the fused correction; without sinks FA3
        assert _resolve(reg, segs, Feature.SINKS).chosen == "fa3"
        assert _resolve(reg, segs).chosen == "fa3"
    # no sinks, small work: torch varlen, as the H200 profile prefers
    res = _resolve(reg, [256] * 16)
    assert res.chosen == "torch_varlen" and res.decided_by == "profile", res.explain()
    assert _resolve(reg, [1024] * 8).chosen == "fa3"


def test_hopper_without_fa4_keeps_fa3_for_sinks(monkeypatch) -> None:
    reg = _world(monkeypatch, (9, 0), fa4_installed=False)
    for segs in SHORT_PACKS.values():
        assert _resolve(reg, segs, Feature.SINKS).chosen == "fa3"


def test_blackwell_resolution_prefers_fa4_where_fa3_cannot_run(monkeypatch) -> None:
    reg = _world(monkeypatch, (10, 0))
    for segs in [*SHORT_PACKS.values(), *LONG_PACKS.values()]:
        res = _resolve(reg, segs, Feature.SINKS)
        assert res.chosen == "fa4", res.explain()
        fa3 = next(c for c in res.candidates if c.provider == "fa3")
        assert any(r.field == "compute_capability" and r.actual == "10.0" for r in fa3.reasons), res.explain()
    for segs in LONG_PACKS.values():
        assert _resolve(reg, segs).chosen == "fa4"
        assert _resolve(reg, segs, Feature.SOFTCAP, Feature.GQA, Feature.LSE).chosen == "fa4"
    # No profile measured this device: the generic one says so, and priority decides (FA4 before torch
    # varlen; the H200's short-work corners were never measured for FA4 or on Blackwell).
    res = _resolve(reg, [256] * 16)
    assert res.chosen == "fa4" and res.decided_by == "priority", res.explain()
    assert res.profile is not None and res.profile.source == "generic" and "magi2 tune" in res.explain()


def test_blackwell_with_a_broken_fa4_says_why(monkeypatch) -> None:
    reg = _world(monkeypatch, (10, 0), fa4_usable=False)
    res = _resolve(reg, [32768], Feature.SINKS)
    assert res.chosen == "torch_varlen", res.explain()
    fa4 = next(c for c in res.candidates if c.provider == "fa4")
    assert fa4.reasons[0].code == ReasonCode.UNAVAILABLE and "libcuda" in fa4.reasons[0].detail


# ---------------------------------------------------------------------------------------------
# warm-up
# ---------------------------------------------------------------------------------------------
def test_warmup_runs_each_shape_through_the_resolver(registered) -> None:
    from magi2_backend_cuda_fa4 import warmup

    records = warmup([[5, 0, 7], [3]], heads_q=2, heads_kv=1, head_dim=16, dtype=torch.float32, device="cpu")
    assert [r.segments for r in records] == [(5, 0, 7), (3,)]
    q = torch.randn(12, 2, 16)
    cu = torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    chosen = m2.resolve("attention", q, q[:, :1], q[:, :1], cu, cu, sinks=torch.randn(1, 2)).chosen
    assert all(r.provider == chosen and r.first_s > 0 and r.cached_s > 0 for r in records)
    with pytest.raises(ValueError, match="segment lengths"):
        warmup([[]], device="cpu")


# ---------------------------------------------------------------------------------------------
# upstream's sink kinds (normal, large, -inf, +inf, all -inf), both rescale modes, with the LSE
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("return_lse", [True, False], ids=["lse", "no-lse"])
@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize("kind", SINK_KINDS)
def test_upstream_sink_kinds(monkeypatch, kind, n_sinks, rescale, return_lse) -> None:
    fake = FakeFA4()
    p = _provider(monkeypatch, fake)
    q, k, v, cq, ck, _ = _inputs(9, [0, 9, 9, 20, 31], [0, 12, 16, 16, 30], n_sinks=0)  # rows without keys too
    sinks = sink_logits(kind, n_sinks, 4, torch.Generator().manual_seed(n_sinks))
    o, lse = _call(p, q, k, v, cq, ck, sinks, rescale=rescale, return_lse=return_lse)
    assert (fake.calls[-1]["learnable_sink"] is not None) == (rescale == "fp32")  # native only in FP32
    ro, rlse = _ref(q, k, v, cq, ck, sinks, rescale=rescale)
    assert accept_attention(o, ro), accept_attention(o, ro)
    if return_lse:
        assert accept_lse(lse, rlse, q.dtype), accept_lse(lse, rlse, q.dtype)
    plain_o, plain_lse = _call(p, q, k, v, cq, ck, None, return_lse=return_lse)
    assert oracles.sink_kind_violations(o, lse, sinks, plain_o, plain_lse) == []
