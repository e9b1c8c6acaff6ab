"""Entry-point-style module of the bad example backend (a module-level ``magi2_backend`` hook)."""

from __future__ import annotations

from magi2_core.model.backend_spec import BackendSpec
from magi2_core.model.capability import Capability
from magi2_core.model.problem import Feature

_ATTN_FEATURES = frozenset({Feature.SINKS, Feature.GQA, Feature.LSE, Feature.SOFTCAP})

PROVIDERS = (
    Capability(
        op="attention",
        name="bad_attention",
        impl="bad_provider.kernels:bad_attention",
        version="0.0.1",
        device_types=("cpu",),
        dtypes=("float32", "bfloat16"),
        head_dims=(32, 64),
        features=_ATTN_FEATURES,
        priority=-10,
        description="forgets the sinks; LSE in the wrong layout",
    ),
    Capability(
        op="rmsnorm",
        name="bad_rmsnorm",
        impl="bad_provider.kernels:bad_rmsnorm",
        version="0.0.1",
        device_types=("cpu",),
        dtypes=("float32", "bfloat16"),
        priority=-10,
        description="ignores modality_sizes",
    ),
    Capability(
        op="attention",
        name="overclaim_attention",
        impl="bad_provider.kernels:overclaim_attention",
        version="0.0.1",
        device_types=("cpu",),
        dtypes=("bfloat16", "float16"),
        head_dims=(64,),
        priority=-10,
        description="claims float16, refuses it in check()",
    ),
)


def magi2_backend() -> BackendSpec:
    return BackendSpec(name="magi2-backend-bad-example", version="0.0.1", core_api=">=2.0,<3", providers=PROVIDERS)
