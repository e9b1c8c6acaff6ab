"""Entry point of magi2-backend-triton: descriptors and dispatch rules as data (no kernel imports)."""

from __future__ import annotations

import os

from magi2_backend_triton import __version__
from magi2_core.capability import Capability, Condition, IntRange, Provenance, Rule
from magi2_core.hookspecs import BackendSpec, hookimpl
from magi2_core.problem import Feature

_PKG = "magi2_backend_triton.providers"


def _device_types() -> tuple[str, ...]:
    # The CPU runs Triton kernels only through the interpreter (CI, small shapes).
    return ("cuda", "musa", "cpu") if os.environ.get("TRITON_INTERPRET") == "1" else ("cuda", "musa")


# Below this many local tokens on CUDA the torch-native grouped-GEMM pipeline is at least as fast as
# the fused kernel (route alignment and launch costs dominate); see the provenance for the measurement.
MOE_CUDA_MIN_TOKENS = 4096
MOE_MIN_TOKENS_SOURCE = Provenance(
    kind="upstream",
    source="vllm-omni #7206 (H20: fused iff T >= 4096 local tokens on CUDA)",
    note="to be replaced by the H200 crossover from benchmarks/moe.py",
)


def providers() -> tuple[Capability, ...]:
    devices = _device_types()
    return (
        Capability(
            op="moe_experts",
            name="triton",
            impl=f"{_PKG}:triton_moe_experts",
            version=__version__,
            device_types=devices,
            dtypes=("bfloat16",),
            features=frozenset(),
            priority=20,
            rules=(
                Rule(
                    id="triton-moe-cuda-min-tokens",
                    when=(
                        Condition(field="device_type", op="eq", value="cuda"),
                        Condition(field="tokens", op="lt", value=MOE_CUDA_MIN_TOKENS),
                    ),
                    reason="below the measured crossover the torch-native pipeline is as fast or faster",
                    provenance=MOE_MIN_TOKENS_SOURCE,
                ),
            ),
            description="fused BF16 routed MoE: on-device route alignment, GEMM1+SwiGLU7, GEMM2 x weight, top-k sum; "
            "not deterministic-mode, not while compiling (vllm-omni #7206 dispatch policy)",
        ),
        Capability(
            op="rmsnorm",
            name="triton",
            impl=f"{_PKG}:triton_rmsnorm_provider",
            version=__version__,
            device_types=devices,
            dtypes=("float32", "bfloat16", "float16"),
            ranges=(IntRange(field="width", min=1, max=32768),),
            features=frozenset({Feature.DETERMINISTIC, Feature.COMPILING}),
            priority=20,
            description="one-pass multi-modality RMSNorm: FP32 sum of squares, (w[m]+1) scale, one cast",
        ),
    )


@hookimpl
def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-triton",
        version=__version__,
        core_api=">=1.0,<2",
        providers=providers(),
        description="portable Triton kernels (CUDA, MUSA through Triton-MUSA; CPU through the interpreter)",
    )
