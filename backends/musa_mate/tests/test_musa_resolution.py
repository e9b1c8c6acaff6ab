"""Resolution of MUSA problems: the short-sequence rule, device isolation from CUDA providers, caching."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import magi2_backend_reference.plugin as reference_plugin
import pytest
import torch
from magi2_backend_musa_mate import plugin as mate_plugin
from magi2_backend_musa_mate.provider import mate_attention
from musa_fakes import MusaWorld

import magi2_core as m2
from magi2_core.errors import ProviderNotEligibleError
from magi2_core.model.backend_spec import BackendSpec
from magi2_core.model.capability import Capability
from magi2_core.model.problem import FEATURE_BIT, Feature, Problem
from magi2_core.ops.attention import SPEC as ATTENTION
from magi2_core.ops.attention import AttentionKey
from magi2_core.reasons import Candidate, ReasonCode, Resolution, Verdict
from magi2_core.selection.dispatch import Dispatcher
from magi2_core.selection.registry import Registry, get_registry
from magi2_core.selection.resolver import resolve_problem


class _CudaOnly:
    """A CUDA-only vendor backend ranked above MATE: it must never serve a MUSA problem."""

    def magi2_backend(self) -> BackendSpec:
        cap = Capability(
            op="attention",
            name="cuda_vendor",
            impl="magi2_backend_reference.attention:reference_attention",
            device_types=("cuda",),
            dtypes=("bfloat16", "float16"),
            priority=40,
            features=frozenset(Feature),
        )
        return BackendSpec(name="test-cuda-only", version="0", core_api=">=2.0,<3", providers=(cap,))


@pytest.fixture
def registry() -> Iterator[Registry]:
    reg = Registry(discover=False)
    reg.register(reference_plugin, "reference")
    reg.register(mate_plugin, "musa_mate")
    reg.register(_CudaOnly(), "cuda_only")
    yield reg


def _lengths(cu: list[int]) -> int:
    return max(b - a for a, b in itertools.pairwise(cu))


def musa_problem(
    cu_q: list[int],
    *,
    dtype: str = "bfloat16",
    head_dim: int = 128,
    cu_k: list[int] | None = None,
    features: frozenset[Feature] = frozenset({Feature.SINKS, Feature.GQA}),
) -> Problem:
    cu_k = cu_q if cu_k is None else cu_k
    return Problem(
        op="attention",
        device_type="musa",
        dtype=dtype,
        features=features,
        tokens=cu_q[-1],
        tokens_k=cu_k[-1],
        max_seqlen_q=_lengths(cu_q),
        max_seqlen_k=_lengths(cu_k),
        num_segments=len(cu_q) - 1,
        head_dim=head_dim,
        num_heads_q=4,
        num_heads_kv=2,
    )


def _candidate(res: Resolution, name: str) -> Candidate:
    return next(c for c in res.candidates if c.provider == name)


@pytest.mark.parametrize("cu,chosen", [([0, 20, 40], "reference"), ([0, 40], "mate"), ([0, 8, 40], "mate")])
def test_short_sequence_rule_uses_the_longest_segment(
    world: MusaWorld, registry: Registry, cu: list[int], chosen: str
) -> None:
    world.musa_with("v0.2.2")
    res = resolve_problem(musa_problem(cu), registry=registry)
    assert res.chosen == chosen
    if chosen == "reference":
        mate = _candidate(res, "mate")
        assert mate.verdict is Verdict.REJECTED
        assert [(r.code, r.field) for r in mate.reasons] == [(ReasonCode.RULE, "mate-short-sequence")]
        assert "fast-exp2" in mate.reasons[0].detail and "vllm-omni#7307" in mate.reasons[0].detail
        assert "mate-short-sequence" in res.explain()


@pytest.mark.parametrize(
    "longest,chosen",
    [(0, "reference"), (1, "reference"), (31, "reference"), (32, "mate"), (33, "mate"), (4096, "mate")],
)
def test_floor_boundary(world: MusaWorld, registry: Registry, longest: int, chosen: str) -> None:
    world.musa_with("v0.2.2")
    cu = [0, 5, 5 + longest] if longest > 5 else [0, longest, 2 * longest]
    assert resolve_problem(musa_problem(cu, cu_k=[0, 50, 100]), registry=registry).chosen == chosen


def test_rule_is_data_with_provenance() -> None:
    rule = mate_plugin.SHORT_SEQUENCE_RULE
    assert rule in mate_plugin.MATE_ATTENTION.rules
    assert rule.provenance.kind == "upstream" and rule.provenance.source == "vllm-project/vllm-omni#7307"
    assert [(c.field, c.op, c.value) for c in rule.when] == [("max_seqlen_q", "lt", 32)]
    assert rule.reason == (
        "MATE fast-exp2 error accumulates over many tiny layers; the exact reference serves short sequences"
    )
    cap = mate_plugin.MATE_ATTENTION
    assert (cap.name, cap.priority, cap.device_types) == ("mate", 30, ("musa",))
    assert cap.dtypes == ("bfloat16", "float16")
    assert Feature.SINKS in cap.features and Feature.SOFTCAP in cap.features and Feature.LSE in cap.features
    assert 32 in cap.boundaries()["max_seqlen_q"]
    Capability.model_validate_json(cap.model_dump_json())  # the listing round-trips


def test_cuda_only_providers_never_serve_musa(world: MusaWorld, registry: Registry) -> None:
    world.musa_with("v0.2.2")
    res = resolve_problem(musa_problem([0, 64]), registry=registry)
    assert res.chosen == "mate"
    cuda = _candidate(res, "cuda_vendor")
    assert cuda.verdict is Verdict.REJECTED and [r.code for r in cuda.reasons] == [ReasonCode.DEVICE_TYPE]


def test_installed_backends_resolve_musa_to_mate(world: MusaWorld) -> None:
    """Through the entry points actually installed (the CUDA FA3 backend included, when present)."""
    world.musa_with("v0.2.2")
    res = resolve_problem(musa_problem([0, 64]))
    assert res.chosen == "mate"
    for c in res.candidates:
        cap = get_registry().provider("attention", c.provider)
        assert cap is not None
        devices = cap.capability.device_types
        if "musa" not in devices and "*" not in devices:
            assert c.verdict is Verdict.REJECTED and ReasonCode.DEVICE_TYPE in [r.code for r in c.reasons]


@pytest.mark.parametrize(
    "dtype,head_dim,cu_k,code",
    [
        ("float32", 128, None, ReasonCode.DTYPE),
        ("bfloat16", 96, None, ReasonCode.HEAD_DIM),
        ("bfloat16", 128, [0, 0], ReasonCode.RANGE),
    ],
)
def test_ineligible_inputs_keep_the_reference(
    world: MusaWorld, registry: Registry, dtype: str, head_dim: int, cu_k: list[int] | None, code: ReasonCode
) -> None:
    world.musa_with("v0.2.2")
    res = resolve_problem(musa_problem([0, 64], dtype=dtype, head_dim=head_dim, cu_k=cu_k), registry=registry)
    assert res.chosen == "reference"
    assert code in [r.code for r in _candidate(res, "mate").reasons]
    assert world.finder.imported == []  # statically rejected: MATE was not even imported


def test_missing_mate_falls_back_with_a_reason_and_forcing_it_raises(world: MusaWorld, registry: Registry) -> None:
    world.platform(True)
    world.runtime()
    world.mate(None)
    world.wrapper(None)
    res = resolve_problem(musa_problem([0, 64]), registry=registry)
    assert res.chosen == "reference"
    mate = _candidate(res, "mate")
    assert [r.code for r in mate.reasons] == [ReasonCode.UNAVAILABLE] and "mate" in mate.reasons[0].detail
    with pytest.raises(ProviderNotEligibleError, match="'mate' was forced") as info:
        resolve_problem(musa_problem([0, 64]), provider="mate", registry=registry)
    assert info.value.resolution is not None and "No module named 'mate'" in info.value.resolution.explain()


def test_forcing_mate_below_the_floor_explains_the_rule(world: MusaWorld, registry: Registry) -> None:
    world.musa_with("v0.2.2")
    with pytest.raises(ProviderNotEligibleError) as info:
        resolve_problem(musa_problem([0, 6]), provider="mate", registry=registry)
    assert info.value.resolution is not None and "fast-exp2" in info.value.resolution.explain()


def test_off_musa_a_musa_problem_never_imports_torchada(world: MusaWorld, registry: Registry) -> None:
    world.platform(False)
    world.runtime(torch_musa=False)
    world.mate(None)
    res = resolve_problem(musa_problem([0, 64]), registry=registry)
    assert res.chosen == "reference" and world.finder.imported == []


def test_dispatcher_cache_respects_the_floor(world: MusaWorld, registry: Registry) -> None:
    """The hot-path cache buckets max_seqlen_q at the rule's boundary: 40 -> 20 -> 40 flips both ways."""
    world.musa_with("v0.2.2")
    disp = Dispatcher(registry)
    mask = FEATURE_BIT[Feature.SINKS] | FEATURE_BIT[Feature.GQA]

    def kernel(longest: int) -> object:
        raw = ("musa", "bfloat16", None, mask, 2 * longest, 2 * longest, longest, longest, 2, 128, 4, 2)
        return disp.kernel(ATTENTION, AttentionKey(*raw), None).kernel

    reference = registry.provider("attention", "reference")
    assert reference is not None
    assert kernel(40) is mate_attention
    assert kernel(20) is reference.load()[0]
    assert kernel(31) is reference.load()[0]
    assert kernel(32) is mate_attention
    assert kernel(40) is mate_attention


def test_public_resolve_of_cpu_tensors_never_picks_mate() -> None:
    q = torch.randn(64, 4, 128).to(torch.bfloat16)
    kv = torch.randn(64, 2, 128).to(torch.bfloat16)
    cu = torch.tensor([0, 64], dtype=torch.int32)
    res = m2.resolve("attention", q, kv, kv, cu, cu, sinks=torch.randn(1, 4))
    assert res.problem.device_type == "cpu" and res.chosen != "mate"
    assert [r.code for r in _candidate(res, "mate").reasons] == [ReasonCode.DEVICE_TYPE]
