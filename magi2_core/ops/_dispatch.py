"""The process-wide dispatcher the op calls use (created on first use, over the process registry), and
the run-time switches that invalidate its cached decisions (strict mode, device value checks)."""

from __future__ import annotations

from magi2_core.contracts._checks import replace_device_value_checks
from magi2_core.registry import get_registry
from magi2_core.resolver import Dispatcher
from magi2_core.strict import replace_strict

__all__ = ["dispatcher", "set_device_value_checks", "set_strict"]

_DISPATCHER: Dispatcher | None = None


def dispatcher() -> Dispatcher:
    """The process-wide memoised resolver used by the op calls."""
    global _DISPATCHER
    d = _DISPATCHER
    if d is None:
        d = _DISPATCHER = Dispatcher(get_registry())
    return d


def set_strict(enabled: bool | None) -> bool | None:
    """Turn strict mode on (``True``) or off (``False``) for the process, over ``MAGI2_STRICT``;
    ``None`` follows the variable again. Returns the previous setting (passing it back restores it).

    Only ``True``, ``False`` and ``None`` are accepted: a string such as ``"no"`` is truthy, and
    ``bool("no")`` would have turned strict mode on. Clears the op dispatcher's cache, so that a
    decision cached before the switch is judged again.
    """
    previous = replace_strict(enabled)
    dispatcher().clear()
    return previous


def set_device_value_checks(enabled: bool | None) -> bool | None:
    """Turn host-syncing checks of device-resident values on or off (``None``: follow
    ``MAGI2_CHECK_DEVICE_VALUES``); returns the previous setting, which restores it when passed back.
    Clears the ops' cached call layouts, which were validated under the old setting."""
    previous = replace_device_value_checks(enabled)
    dispatcher().clear()
    return previous
