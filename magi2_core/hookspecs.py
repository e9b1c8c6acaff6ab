"""What a backend distribution may implement (pluggy hook specifications).

A backend registers a module (or object) under the entry-point group ``magi2_core.backends``; the
module implements ``magi2_backend`` (required, cheap: descriptors only, no kernel imports) and may
implement ``magi2_sink_corrections`` (learned-sink corrections, see :mod:`magi2_core.sink_corrections`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pluggy
from pydantic import BaseModel, ConfigDict, Field

from magi2_core.capability import Capability

__all__ = ["PROJECT", "BackendHooks", "BackendSpec", "SinkCorrectionSpec", "hookimpl", "hookspec"]

PROJECT = "magi2_core"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class BackendSpec(BaseModel):
    """A backend distribution: its providers and the core contract range it implements."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="distribution name, e.g. 'magi2-backend-triton'")
    version: str
    core_api: str = Field(description="PEP 440 specifier of supported core contract versions, e.g. '>=2.0,<3'")
    providers: tuple[Capability, ...]
    description: str = ""
    profiles: tuple[str, ...] = Field(
        (), description="device-profile fragments this backend ships, as 'package:path/file.json' package-data "
                        "resources (docs/profiles.md); read and validated when the backend loads"
    )


class SinkCorrectionSpec(BaseModel):
    """A learned-sink correction that a backend contributes: data only, its kernel imported on first use.

    ``impl`` names a callable with the :class:`magi2_core.sink_corrections.SinkCorrectionFn` signature.
    For a device type the core picks the highest-``priority`` correction that lists it in
    ``device_types`` (the core's torch correction, priority 0, serves every device type).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="unique among all backends, e.g. 'triton'")
    impl: str = Field(pattern=r"^[\w.]+:[\w.]+$", description="'module:attr' of the correction callable")
    device_types: tuple[str, ...] = Field(min_length=1, description="device types it is picked for by priority")
    priority: int = 0
    description: str = ""
    backend: str = Field("", description="filled in by the registry")


class BackendHooks:
    @hookspec(firstresult=True)
    def magi2_backend(self) -> BackendSpec:  # type: ignore[empty-body]
        """Describe this backend. Must be cheap and must not import kernels."""

    @hookspec
    def magi2_sink_corrections(self) -> Sequence[SinkCorrectionSpec]:  # type: ignore[empty-body]
        """Optional: the learned-sink corrections this backend contributes. Cheap: descriptors only."""
