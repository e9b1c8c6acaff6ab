"""Entry point of magi2-backend-reference: descriptors only (kernels are imported when chosen)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

from magi2_backend_reference import __version__
from magi2_core.backend import BackendSpec, Capability, Feature

# Every feature an attention call can ask for (the routing ones belong to moe_route).
_ATTENTION_FEATURES = frozenset(Feature) - {Feature.ROUTE_SOFTMAX, Feature.ROUTE_NO_NORM}
_PLAIN = frozenset({Feature.DETERMINISTIC, Feature.COMPILING})  # what the MoE/norm/mHC/RoPE calls can ask for
_FLOATS = ("float32", "bfloat16", "float16")
_PKG = "magi2_backend_reference"
_VARLEN = "torch.nn.attention.varlen"


def _varlen_parameters() -> frozenset[str]:
    """The parameter names of this torch's ``varlen_attn``, read from its source without importing it:
    the import pulls in torch._dynamo (2.6 s of every process's start on a CPU), and describing a
    provider must stay cheap. Empty when torch has no such module (``check()`` then reports the
    provider unavailable, with the reason); the import itself only where the source is not readable."""
    try:
        spec = importlib.util.find_spec(_VARLEN)
    except (ImportError, ValueError):
        return frozenset()
    if spec is None:
        return frozenset()
    try:
        tree = ast.parse(Path(str(spec.origin)).read_text(encoding="utf-8"))
        (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "varlen_attn"]
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):  # no source, or defined elsewhere
        try:
            from torch.nn.attention.varlen import varlen_attn

            return frozenset(inspect.signature(varlen_attn).parameters)
        except (ImportError, ValueError, TypeError):
            return frozenset()
    args = fn.args
    return frozenset(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))


def _varlen_features() -> frozenset[Feature]:
    """GQA only where this torch's varlen_attn takes ``enable_gqa`` (torch 2.11's does not: the
    conformance kit caught the over-claim on the H200)."""
    feats = {Feature.SINKS, Feature.LSE, Feature.COMPILING}
    if "enable_gqa" in _varlen_parameters():
        feats.add(Feature.GQA)
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
        features=_ATTENTION_FEATURES,
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
        description=(
            "sigmoid (or softmax) scores, biased top-k selection, unbiased (L1-normalised) weights x route_scale"
        ),
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
    Capability(
        op="mhc_pre",
        name="reference",
        impl=f"{_PKG}.mhc:reference_mhc_pre",
        version=__version__,
        device_types=("*",),
        dtypes=_FLOATS,
        out_dtypes=_FLOATS,
        features=_PLAIN,
        priority=0,
        description="float64 norm, projection, coefficients and Sinkhorn; upstream's rounding points",
    ),
    Capability(
        op="mhc_pre",
        name="torch_native",
        impl=f"{_PKG}.torch_mhc:torch_mhc_pre",
        version=__version__,
        device_types=("cuda", "musa"),
        dtypes=_FLOATS,
        out_dtypes=_FLOATS,
        features=_PLAIN,
        priority=10,
        description="vllm-omni 0.30.0's native form: FP32 norm and GEMM, sigmoid, einsum, Sinkhorn in torch",
    ),
    Capability(
        op="mhc_mix",
        name="reference",
        impl=f"{_PKG}.mhc:reference_mhc_mix",
        version=__version__,
        device_types=("*",),
        dtypes=_FLOATS,
        features=_PLAIN,
        priority=0,
        description="float64 mix and branch terms, each rounded to the streams' dtype, then their rounded sum",
    ),
    Capability(
        op="mhc_mix",
        name="torch_native",
        impl=f"{_PKG}.torch_mhc:torch_mhc_mix",
        version=__version__,
        device_types=("cuda", "musa"),
        dtypes=_FLOATS,
        features=_PLAIN,
        priority=10,
        description="vllm-omni 0.30.0's native form: two einsums and their sum",
    ),
    Capability(
        op="qk_norm_rope",
        name="reference",
        impl=f"{_PKG}.qk_norm_rope:reference_qk_norm_rope",
        version=__version__,
        device_types=("*",),
        dtypes=_FLOATS,
        out_dtypes=_FLOATS,
        features=_PLAIN,
        priority=0,
        description="float64 norm, (w[m]+1), gather and half-split rotation, one final cast",
    ),
    Capability(
        op="qk_norm_rope",
        name="torch_native",
        impl=f"{_PKG}.torch_qk_norm_rope:torch_qk_norm_rope",
        version=__version__,
        device_types=("cuda", "musa"),
        dtypes=_FLOATS,
        out_dtypes=_FLOATS,
        features=_PLAIN,
        priority=10,
        description="vllm-omni 0.30.0's native form: FP32 norm, index_select, apply_rotary_emb, cast",
    ),
    Capability(
        op="output_gate",
        name="reference",
        impl=f"{_PKG}.output_gate:reference_output_gate",
        version=__version__,
        device_types=("*",),
        dtypes=_FLOATS,
        out_dtypes=_FLOATS,
        features=_PLAIN,
        priority=0,
        description="float64 gather, sigmoid and product, one final cast",
    ),
    Capability(
        op="output_gate",
        name="torch_native",
        impl=f"{_PKG}.torch_output_gate:torch_output_gate",
        version=__version__,
        device_types=("cuda", "musa"),
        dtypes=_FLOATS,
        out_dtypes=_FLOATS,
        features=_PLAIN,
        priority=10,
        description="index_select, then x * sigmoid(gate) in FP32 and a cast (vllm-omni's form as inductor "
        "computes it)",
    ),
)


def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-reference",
        version=__version__,
        core_api=">=2.0,<3",
        providers=PROVIDERS,
        description="exact references for every operator, on any device, and torch-native providers",
    )
