"""Entry point of magi2-backend-reference: descriptors only (kernels are imported when chosen)."""

from __future__ import annotations

import inspect

from magi2_backend_reference import __version__
from magi2_core.capability import Capability
from magi2_core.hookspecs import BackendSpec, hookimpl
from magi2_core.problem import Feature

_ALL_FEATURES = frozenset(Feature)
_PLAIN = frozenset({Feature.DETERMINISTIC, Feature.COMPILING})  # what the MoE/RMSNorm calls can ask for
_FLOATS = ("float32", "bfloat16", "float16")
_PKG = "magi2_backend_reference"


def _varlen_features() -> frozenset[Feature]:
    """GQA only where this torch's varlen_attn takes ``enable_gqa`` (torch 2.11 does not: the
    conformance kit caught the over-claim on the H200). A signature read, no kernel import."""
    feats = {Feature.SINKS, Feature.LSE, Feature.COMPILING}
    try:
        from torch.nn.attention.varlen import varlen_attn

        if "enable_gqa" in inspect.signature(varlen_attn).parameters:
            feats.add(Feature.GQA)
    except (ImportError, ValueError, TypeError):
        pass  # no varlen_attn at all: check() reports the provider unavailable with the reason
    return frozenset(feats)

# Priorities: reference 0 (always eligible, last resort), torch-native 10, Triton 20, vendor kernels 30.
PROVIDERS = (
    Capability(
        op="attention",
        name="reference",
        impl=f"{_PKG}.attention:reference_attention",
        version=__version__,
        device_types=("*",),
        dtypes=_FLOATS,
        features=_ALL_FEATURES,
        priority=0,
        description="exact FP32 block-diagonal attention, query-chunked; sinks by the FP32 LSE correction",
    ),
    Capability(
        op="attention",
        name="torch_varlen",
        impl=f"{_PKG}.torch_attention:torch_varlen_attention",
        version=__version__,
        device_types=("cuda",),
        dtypes=("bfloat16", "float16"),
        head_dims=tuple(range(8, 257, 8)),
        features=_varlen_features(),
        priority=10,
        description="torch.nn.attention.varlen.varlen_attn (FA2 inside torch) + the LSE sink correction",
    ),
    Capability(
        op="moe_route",
        name="reference",
        impl=f"{_PKG}.moe:reference_moe_route",
        version=__version__,
        device_types=("*",),
        dtypes=_FLOATS,
        features=_PLAIN | {Feature.ROUTE_SOFTMAX, Feature.ROUTE_NO_NORM},
        priority=0,
        description="sigmoid (or softmax) scores, biased top-k selection, unbiased (L1-normalised) weights x route_scale",
    ),
    Capability(
        op="moe_experts",
        name="reference",
        impl=f"{_PKG}.moe:reference_moe_experts",
        version=__version__,
        device_types=("*",),
        dtypes=_FLOATS,
        features=_PLAIN,
        priority=0,
        description="exact rounding schedule, expert by expert (FP32 gate/up, BF16 intermediate, BF16 per route)",
    ),
    Capability(
        op="rmsnorm",
        name="reference",
        impl=f"{_PKG}.rmsnorm:reference_rmsnorm",
        version=__version__,
        device_types=("*",),
        dtypes=_FLOATS,
        features=_PLAIN,
        priority=0,
        description="x·rsqrt(mean(x²)+eps)·(w[m]+1) in FP32, one final cast",
    ),
    Capability(
        op="rmsnorm",
        name="torch_native",
        impl=f"{_PKG}.torch_rmsnorm:torch_rmsnorm",
        version=__version__,
        device_types=("cuda", "musa"),
        dtypes=_FLOATS,
        features=_PLAIN,
        priority=10,
        description="F.rms_norm on the FP32 input (no affine), then (w+1) and one cast (vllm-omni #7286)",
    ),
)


@hookimpl
def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-reference",
        version=__version__,
        core_api=">=1.0,<2",
        providers=PROVIDERS,
        description="exact references for every operator, on any device, and torch-native providers",
    )
