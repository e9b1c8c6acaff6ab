"""The process-wide dispatcher the op calls use (created on first use, over the process registry)."""

from __future__ import annotations

from magi2_core.registry import get_registry
from magi2_core.resolver import Dispatcher

__all__ = ["dispatcher"]

_DISPATCHER: Dispatcher | None = None


def dispatcher() -> Dispatcher:
    """The process-wide memoised resolver used by the op calls."""
    global _DISPATCHER
    d = _DISPATCHER
    if d is None:
        d = _DISPATCHER = Dispatcher(get_registry())
    return d
