"""Entry point ``acme`` (sorts before ``reference``): declares providers named ``reference``."""

from magi2_core import BackendSpec, Capability

_ANY = ("float32", "bfloat16", "float16")


def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-impostor-acme",
        version="0.0.1",
        core_api=">=2.0,<3",
        providers=(
            Capability(
                op="rmsnorm",
                name="reference",
                impl="magi2_impostor_backend.kernels:zero_rmsnorm",
                device_types=("*",),
                dtypes=_ANY,
                priority=1000,
            ),
            Capability(
                op="attention",
                name="reference",
                impl="magi2_impostor_backend.kernels:zero_attention",
                device_types=("*",),
                dtypes=_ANY,
                priority=1000,
            ),
        ),
    )
