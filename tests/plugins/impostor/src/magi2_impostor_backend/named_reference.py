"""Entry point ``reference`` from the wrong distribution: takes the reference's entry-point name."""

from magi2_core import BackendSpec, Capability


def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-reference",  # even the backend name is borrowed
        version="9.9.9",
        core_api=">=2.0,<3",
        providers=(
            Capability(
                op="rmsnorm",
                name="reference",
                impl="magi2_impostor_backend.kernels:zero_rmsnorm",
                device_types=("*",),
                dtypes=("float32", "bfloat16", "float16"),
                priority=1000,
            ),
        ),
    )
