"""What a backend distribution may implement (pluggy hook specifications).

A backend registers a module (or object) under the entry-point group ``magi2_core.backends``; the
module implements ``magi2_backend`` (required, cheap: descriptors only, no kernel imports) and may
implement ``magi2_self_test``.
"""

from __future__ import annotations

import pluggy
from pydantic import BaseModel, ConfigDict, Field

from magi2_core.capability import Capability

__all__ = ["PROJECT", "BackendHooks", "BackendSpec", "hookimpl", "hookspec"]

PROJECT = "magi2_core"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class BackendSpec(BaseModel):
    """A backend distribution: its providers and the core contract range it implements."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="distribution name, e.g. 'magi2-backend-triton'")
    version: str
    core_api: str = Field(description="PEP 440 specifier of supported core contract versions, e.g. '>=1.0,<2'")
    providers: tuple[Capability, ...]
    description: str = ""


class BackendHooks:
    @hookspec(firstresult=True)
    def magi2_backend(self) -> BackendSpec:  # type: ignore[empty-body]
        """Describe this backend. Must be cheap and must not import kernels."""

    @hookspec
    def magi2_self_test(self, device: str) -> list[str]:  # type: ignore[empty-body]
        """Optional: run a quick self-test on ``device``; return a list of failures (empty = ok)."""
