"""No silent slow path: the resolution log and strict mode.

Every new resolution decision (a new cache key of the op dispatcher) is logged at DEBUG on the
``magi2_core`` logger: the op, the key, the provider and what decided. When an accelerator call
(any device type but ``cpu``) falls to the ``reference`` provider by priority (or by a device
profile's preference), that is the slow
path a user must hear about: a WARNING, once per key, naming why every faster provider was
rejected. In strict mode (``MAGI2_STRICT=1`` or :func:`magi2_core.set_strict`) the same call raises
:class:`~magi2_core.errors.StrictModeError` instead.

Only priority and profile decisions are judged: a provider forced by ``provider=``, ``use(...)`` or a
``MAGI2_*_PROVIDER`` variable is the caller's explicit choice (the conformance kit forces the
reference on purpose), and is logged at DEBUG like any other decision.
"""

from __future__ import annotations

import logging

from magi2_core import config
from magi2_core.errors import InvalidValueError, StrictModeError
from magi2_core.reasons import Resolution, Verdict

__all__ = ["LOGGER", "REFERENCE", "check_resolution", "is_strict", "replace_strict"]

LOGGER = logging.getLogger("magi2_core")
REFERENCE = "reference"

# None: follow MAGI2_STRICT; True/False: set by set_strict() for the whole process.
_STRICT: bool | None = None


def replace_strict(enabled: bool | None) -> bool | None:
    """Set the process's strict mode (``None``: follow ``MAGI2_STRICT``) and return the previous setting.

    What :func:`magi2_core.set_strict` does besides clearing the ops' cached decisions. Only ``True``,
    ``False`` and ``None`` are accepted: a string such as ``"no"`` is truthy, and ``bool("no")`` would
    have turned strict mode on.
    """
    global _STRICT
    if enabled is not None and not isinstance(enabled, bool):
        raise InvalidValueError("set_strict", "enabled", "True, False or None", repr(enabled))
    previous, _STRICT = _STRICT, enabled
    return previous


def is_strict() -> bool:
    """Whether an accelerator call resolved to the reference raises (:func:`magi2_core.set_strict`, else
    ``MAGI2_STRICT``)."""
    if _STRICT is not None:
        return _STRICT
    return bool(config.get("MAGI2_STRICT"))


def _rejections(res: Resolution) -> str:
    parts = []
    for c in res.candidates:
        if c.provider == REFERENCE or c.verdict != Verdict.REJECTED:
            continue
        parts.append(f"{c.provider} ({c.backend}): " + "; ".join(str(r) for r in c.reasons))
    return " | ".join(parts) or "no other provider is installed for this op"


def check_resolution(key: object, res: Resolution) -> None:
    """Log a new decision; warn about (or, in strict mode, refuse) the reference on an accelerator."""
    p = res.problem
    LOGGER.debug("resolved %s key=%r -> %s (decided by %s)", p.op, key, res.chosen, res.decided_by)
    if res.chosen != REFERENCE or res.decided_by not in ("priority", "profile") or p.device_type == "cpu":
        return
    why = _rejections(res)
    if is_strict():
        raise StrictModeError(
            f"{p.op} on {p.device_type} ({p.dtype}) would run on the eager reference, and strict mode is on "
            f"(MAGI2_STRICT=1 or magi2_core.set_strict(True)). Faster providers rejected: {why}. "
            f"Install or enable a provider that serves this call, or turn strict mode off to accept the reference.",
            res,
        )
    LOGGER.warning(
        "%s on %s (%s) runs on the eager reference provider (slow); rejected: %s", p.op, p.device_type, p.dtype, why
    )
