"""Entry point of magi2-backend-cuda-fa4: the FA4 attention descriptor (no kernel is imported here).

Priority 25: below FA3 (30), above Triton (20) and torch's varlen kernel (10). So:

* on Blackwell (cc 10.x) FA3's ``check`` fails (it has sm90 kernels only) and FA4 is the
  FlashAttention that serves the call;
* on Hopper FA3 ranks first; where FA4's native sink is faster (short packs with a sink, measured on
  the H200), the device profile prefers FA4 (``h200-fa4-sink-*`` in magi2_core/profiles/nvidia-h200.json).

What needs the kernel or the device (the import, the compute capability) is reported by the
kernel object's ``check``.
"""

from __future__ import annotations

from magi2_backend_cuda_fa4 import __version__
from magi2_backend_cuda_fa4.discovery import FA4Install, installed
from magi2_core.backend import BackendSpec, Capability, Feature

__all__ = ["HEAD_DIMS", "descriptor", "magi2_backend"]

# FA4 checks head dims per architecture: sm90 serves 8..256, sm100 8..128 (and 256 without sinks or
# softcap). The descriptor cannot see the device, so it claims what both serve with sinks and
# softcap, in the 16-byte alignment FA4 requires for 2-byte dtypes. MAGI-2 uses 128.
HEAD_DIMS = tuple(range(8, 129, 8))

# Which eligible provider is faster where is not this descriptor's to say: FA4's former short-work
# rules (FA3's H200 corners, assumed for FA4, never measured for it) and FA3's former rules that stood
# aside for FA4's native sink on short packs are preferences of the device profiles
# (magi2_core/profiles/nvidia-h200.json, docs/profiles.md).


def descriptor(install: FA4Install | None) -> Capability:
    source = install.label if install is not None else "flash-attn-4 not installed"
    return Capability(
        op="attention",
        name="fa4",
        impl="magi2_backend_cuda_fa4.provider:fa4_attention",
        version=f"{__version__} ({source})",
        device_types=("cuda",),
        dtypes=("bfloat16", "float16"),
        head_dims=HEAD_DIMS,
        features=frozenset(
            {Feature.SOFTCAP, Feature.SINKS, Feature.GQA, Feature.LSE, Feature.DETERMINISTIC, Feature.COMPILING}
        ),
        priority=25,
        description="FlashAttention-4 varlen (CuTe DSL, JIT), cc 9.x and 10.x; sinks native for sink_rescale='fp32', "
        "through the fused correction for 'activation'",
    )


def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-cuda-fa4",
        version=__version__,
        core_api=">=2.0,<3",
        providers=(descriptor(installed()),),
        description="MAGI-2 attention through FlashAttention-4 on NVIDIA Hopper and Blackwell",
    )
