"""Entry point of magi2-backend-triton: descriptors and dispatch rules as data (no kernel imports)."""

from __future__ import annotations

from magi2_backend_triton import __version__
from magi2_backend_triton.interpret import interpreting
from magi2_core.backend import BackendSpec, Capability, Feature, IntRange, SinkCorrectionSpec

_PKG = "magi2_backend_triton.providers"


def _device_types() -> tuple[str, ...]:
    # The CPU runs Triton kernels only through the interpreter (CI, small shapes).
    return ("cuda", "musa", "cpu") if interpreting() else ("cuda", "musa")


# Dispatch policy of vllm-omni #7206, widened where our kernel allows it: upstream serves BF16 only and
# falls back to its native kernels in deterministic mode and inside torch.compile. Here the fallback
# would be the eager reference, so the fused kernel serves all three float dtypes (FP32 with IEEE
# dots), deterministic mode (a stable-sort route alignment, no float atomics anywhere) and compiled
# graphs (per-call state is bounded caches and route buffers rewritten by every call). Upstream also
# required T >= 4096 local tokens on CUDA (measured on an H20 against its own native kernel). On the
# H200 the fused path beat the torch-native grouped-GEMM pipeline at every token count measured, 1 to
# 14601 (benchmarks/results/moe_h200.json, "crossover"), so no token threshold is declared here.

# The fused MoE's plan rows (moe/plan.py), as profile fragments the core reads and merges: measured rows
# for named devices, generic rows per device class.
PROFILES = tuple(
    f"magi2_backend_triton:profiles/{name}.json"
    for name in ("nvidia-h100", "nvidia-h200", "generic-cuda-sm90", "generic-cuda", "generic-musa", "generic-cpu")
)


def providers() -> tuple[Capability, ...]:
    devices = _device_types()
    no_musa = tuple(d for d in devices if d != "musa")
    return (
        Capability(
            op="moe_experts",
            name="triton",
            impl=f"{_PKG}:triton_moe_experts",
            version=__version__,
            device_types=devices,
            dtypes=("bfloat16", "float16", "float32"),
            features=frozenset({Feature.DETERMINISTIC, Feature.COMPILING}),
            priority=20,
            description="fused routed MoE: on-device route alignment, GEMM1+SwiGLU7, GEMM2 x weight, top-k sum; "
            "gate/up packed once by prepare_moe_weights",
        ),
        # The fused router walks a head's experts in chunks, so any bank fits its registers; it is tuned
        # and tested on the GPU up to the production bank of 256 experts per head. Wider banks resolve
        # to "triton" below, which reads the torch GEMM's scores from memory instead.
        Capability(
            op="moe_route",
            name="triton_fused",
            impl="magi2_backend_triton.moe_route_fused:triton_fused_moe_route",
            version=__version__,
            device_types=devices,
            dtypes=("bfloat16", "float16", "float32"),
            ranges=(IntRange(field="num_experts", min=1, max=256),),
            features=frozenset(
                {Feature.DETERMINISTIC, Feature.COMPILING, Feature.ROUTE_SOFTMAX, Feature.ROUTE_NO_NORM}
            ),
            priority=25,
            description="one kernel per head group: the router GEMM as exact BF16x3 tensor-core dots (FP32-accurate "
            "logits, never stored) chunk by chunk of experts, sigmoid/softmax, a running biased top-k, unbiased "
            "weights, L1 norm, route_scale; the "
            "router's BF16 planes formed in registers from the FP32 weight",
        ),
        Capability(
            op="moe_route",
            name="triton",
            impl="magi2_backend_triton.moe_route:triton_moe_route",
            version=__version__,
            device_types=devices,
            dtypes=("float32", "bfloat16", "float16"),
            # Deterministic (no atomics) and safe inside torch.compile (the op is opaque there).
            features=frozenset(
                {Feature.DETERMINISTIC, Feature.COMPILING, Feature.ROUTE_SOFTMAX, Feature.ROUTE_NO_NORM}
            ),
            priority=20,
            description="the reference's torch scores, then one kernel: biased top-k (equal scores in expert-id "
            "order), unbiased weights, L1 normalisation, route_scale",
        ),
        Capability(
            op="rmsnorm",
            name="triton",
            impl=f"{_PKG}:triton_rmsnorm_provider",
            version=__version__,
            device_types=devices,
            dtypes=("float32", "bfloat16", "float16"),
            ranges=(IntRange(field="width", min=0, max=32768),),  # width 0: the empty result, no launch
            features=frozenset({Feature.DETERMINISTIC, Feature.COMPILING}),
            priority=20,
            description="one-pass multi-modality RMSNorm: FP32 sum of squares, (w[m]+1) scale, one cast",
        ),
        # mHC: any stream count up to 8 (the release has 4), the streams' three float dtypes. Not on
        # MUSA: the split-BF16 and FP32 IEEE tl.dots and the 3-D tiles have not run under Triton-MUSA.
        Capability(
            op="mhc_pre",
            name="triton",
            impl=f"{_PKG}:triton_mhc_pre",
            version=__version__,
            device_types=no_musa,
            dtypes=("float32", "bfloat16", "float16"),
            out_dtypes=("float32", "bfloat16", "float16"),
            ranges=(IntRange(field="num_streams", min=1, max=8),),
            features=frozenset({Feature.DETERMINISTIC, Feature.COMPILING}),
            priority=20,
            description="two launches: FP32 sum of squares and projection per token tile (BF16 streams: three "
            "exact BF16 tensor-core products against the split folded weight; others: the IEEE FP32 dot; the norm "
            "folded in as a per-token scale); coefficients, weighted stream sum, post and Sinkhorn per token",
        ),
        Capability(
            op="mhc_mix",
            name="triton",
            impl=f"{_PKG}:triton_mhc_mix",
            version=__version__,
            device_types=no_musa,
            dtypes=("float32", "bfloat16", "float16"),
            ranges=(IntRange(field="num_streams", min=1, max=8),),
            features=frozenset({Feature.DETERMINISTIC, Feature.COMPILING}),
            priority=20,
            description="one pass: the residual mix and the post x branch term in FP32, each rounded, summed",
        ),
        # Not on MUSA: not run under Triton-MUSA. Head dims up to 256 (the release has 128) keep a row in
        # one tile.
        Capability(
            op="qk_norm_rope",
            name="triton",
            impl=f"{_PKG}:triton_qk_norm_rope",
            version=__version__,
            device_types=no_musa,
            dtypes=("float32", "bfloat16", "float16"),
            out_dtypes=("float32", "bfloat16", "float16"),
            ranges=(IntRange(field="head_dim", min=2, max=256),),
            features=frozenset({Feature.DETERMINISTIC, Feature.COMPILING}),
            priority=20,
            description="one pass per (token, head) row: gather the source row in place, FP32 norm with "
            "(w[m]+1), half-split rotation by the token's angles, one cast",
        ),
        # Not on MUSA: not run under Triton-MUSA. Head dims up to 1024 keep a row in one tile.
        Capability(
            op="output_gate",
            name="triton",
            impl=f"{_PKG}:triton_output_gate",
            version=__version__,
            device_types=no_musa,
            dtypes=("float32", "bfloat16", "float16"),
            out_dtypes=("float32", "bfloat16", "float16"),
            ranges=(IntRange(field="head_dim", min=1, max=1024),),
            features=frozenset({Feature.DETERMINISTIC, Feature.COMPILING}),
            priority=20,
            description="one pass per (token, head) row: gather the source row in place, x * sigmoid(gate) "
            "in FP32, one cast",
        ),
    )


# CUDA only: there the fused kernel is bit-exact with the core's torch correction (libdevice, as
# torch's kernels). On MUSA (Triton-MUSA's own libdevice) it has not run on hardware yet, so it is
# opt-in there (MAGI2_MATE_SINK_CORRECTION=triton); on CPU the interpreter is far slower than torch.
SINK_CORRECTIONS = (
    SinkCorrectionSpec(
        name="triton",
        impl="magi2_backend_triton.sink_correction:apply_sink_correction",
        device_types=("cuda",),
        priority=10,
        description="fused learned-sink correction: one pass over o and the LSE, in place",
    ),
)


def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-triton",
        version=__version__,
        core_api=">=2.0,<3",
        providers=providers(),
        sink_corrections=SINK_CORRECTIONS,
        profiles=PROFILES,
        description="portable Triton kernels (CUDA, MUSA through Triton-MUSA; CPU through the interpreter)",
    )
