"""Registering providers in process: fakes, interpreter builds and deliberately broken examples.

The kit checks what the registry holds. A backend's CI can put a provider there without installing a
distribution, e.g. its Triton kernels under ``TRITON_INTERPRET=1`` re-hosted on ``cpu``, or a fake of
a vendor kernel::

    from magi2_core.testing import registered_backend, rehost
    with registered_backend(rehost("moe_experts", "triton", device_types=("cpu",), name="triton_interp")):
        ...  # run_kit(["triton_interp"]) or pytest --magi2-provider triton_interp
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from magi2_core.model.backend_spec import BackendSpec
from magi2_core.model.capability import Capability
from magi2_core.model.problem import OpName
from magi2_core.selection.registry import get_registry

__all__ = ["InProcessBackend", "registered_backend", "rehost"]


class InProcessBackend:
    """A backend serving a fixed :class:`BackendSpec`: called, it returns the spec, as the function an
    entry point names does (``get_registry().register`` also takes the spec itself)."""

    def __init__(self, spec: BackendSpec) -> None:
        self.spec = spec

    def __call__(self) -> BackendSpec:
        return self.spec

    def magi2_backend(self) -> BackendSpec:
        return self.spec


def rehost(op: OpName, provider: str, *, device_types: tuple[str, ...], name: str) -> Capability:
    """A copy of an installed provider's descriptor, served on other device types under a new name."""
    loaded = get_registry().provider(op, provider)
    if loaded is None:
        raise ValueError(f"{op}: no installed provider named {provider!r}")
    return loaded.capability.model_copy(update={"device_types": device_types, "name": name, "backend": ""})


@contextmanager
def registered_backend(
    *providers: Capability, name: str = "in-process", version: str = "0", core_api: str = ">=2.0,<3"
) -> Iterator[BackendSpec]:
    """Register ``providers`` as one backend for the duration of the block, then unregister it.

    A spec the registry refuses (a clashing provider name, an incompatible ``core_api``) raises here
    instead of being silently quarantined.
    """
    spec = BackendSpec(name=name, version=version, core_api=core_api, providers=providers)
    reg = get_registry()
    reg.register(InProcessBackend(spec), name=name)
    try:
        refused = [q for q in reg.quarantined() if q.entry_point == name]
        if refused:
            raise ValueError(f"backend {name!r} was not registered: {refused[-1].reason}")
        yield spec
    finally:
        reg.unregister(name)
