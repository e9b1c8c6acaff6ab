"""Entry point of magi2-backend-cuda-fa3: the FA3 attention descriptor (no kernel is imported here).

The descriptor describes the installed build from its packaging alone (``discovery``): its version
string names the distribution, and its head dims follow the build's ``FLASHATTENTION_DISABLE_HDIM*``
flags. What needs the kernel or the device (compute capability, FP16 and softcap compiled out, a
MATE look-alike) is reported by the kernel object's ``check``.
"""

from __future__ import annotations

from magi2_backend_cuda_fa3 import __version__
from magi2_backend_cuda_fa3.discovery import FoundBuild, installed_build
from magi2_core.backend import BackendSpec, Capability, Feature, IntRange

__all__ = ["descriptor", "dtypes", "head_dims", "magi2_backend"]

# FA3 rounds the head dim up to the next compiled class and needs a multiple of 8 (flash_api.cpp).
_HEAD_DIM_CLASSES = (64, 96, 128, 192, 256)

# Which eligible provider is faster where (torch varlen on small work, FA4's native sink on short packs
# with a sink) is not this descriptor's to say: it lives in the device profiles
# (magi2_core/profiles/nvidia-h200.json, docs/profiles.md), so that a call this descriptor can serve is
# never turned away for speed alone (before, deterministic or GQA short work fell to the reference).


def head_dims(build: FoundBuild | None) -> tuple[int, ...]:
    """Head dims the build serves: multiples of 8 up to its largest compiled class."""
    classes = [c for c in _HEAD_DIM_CLASSES if build is None or not build.disabled(f"HDIM{c}")]
    top = max(classes, default=0)
    return tuple(range(8, top + 1, 8))


def dtypes(build: FoundBuild | None) -> tuple[str, ...]:
    """Activation dtypes the build serves (fa3-fwd 0.0.3 compiles FP16 out: the conformance kit caught
    the over-claim on the H200 when FP16 was declared regardless)."""
    return ("bfloat16",) if build is not None and build.disabled("FP16") else ("bfloat16", "float16")


def descriptor(build: FoundBuild | None) -> Capability:
    """The fa3 descriptor for ``build``: what it can serve correctly (the device profiles say where it is
    preferred)."""
    source = build.label if build is not None else "no FA3 build installed"
    return Capability(
        op="attention",
        name="fa3",
        impl="magi2_backend_cuda_fa3.provider:fa3_attention",
        version=f"{__version__} ({source})",
        device_types=("cuda",),
        dtypes=dtypes(build),
        head_dims=head_dims(build),
        ranges=(IntRange(field="tokens", min=1), IntRange(field="tokens_k", min=1)),
        features=frozenset(
            {Feature.SOFTCAP, Feature.SINKS, Feature.GQA, Feature.LSE, Feature.DETERMINISTIC, Feature.COMPILING}
        ),
        priority=30,
        description="FlashAttention-3 varlen (fa3-fwd, flash_attn_3 or tokenspeed-fa3) + the fused sink correction",
    )


def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-cuda-fa3",
        version=__version__,
        core_api=">=2.0,<3",
        providers=(descriptor(installed_build()),),
        description="MAGI-2 attention through FlashAttention-3 on NVIDIA Hopper",
    )
