"""A backend written for the pluggy hooks: the entry point names this module, whose ``@hookimpl``
functions the registry no longer calls (its sink correction would be lost without a word)."""

from magi2_core import BackendSpec, hookimpl
from magi2_core.backend import SinkCorrectionSpec


@hookimpl
def magi2_backend() -> BackendSpec:
    return BackendSpec(name="magi2-backend-broken-legacy", version="0.0.1", core_api=">=2.0,<3", providers=())


@hookimpl
def magi2_sink_corrections() -> tuple[SinkCorrectionSpec, ...]:
    return (SinkCorrectionSpec(name="legacy", impl="magi2_broken_backend.legacy:magi2_backend", device_types=("cpu",)),)
