"""The plan rows a provider reads for one op on one device, and where they come from: :func:`plan_rows`.

A plan row (``plans`` of a profile, :class:`~magi2_core.profiles.model.PlanRow`) names the plan a
provider runs where its conditions hold; the plan itself is the provider's to read. Backends ship their
rows in profile fragments (``BackendSpec.profiles``), read and merged by the core like any profile.
In order, a provider's rows for a device are:

1. those of the active profile's own files (a user profile ``magi2 tune`` wrote, or ``MAGI2_PROFILE``'s
   file, or explain's ``--profile`` file), rows a provider's ``check`` refuses logged and skipped;
2. then the packaged rows for the device itself: the shipped fragments that name it (type, name and
   capability) and hold rows of the provider; where none does, or the generic profile is active,
   the most specific generic fragment that does (one for the device's capability class before one
   for any device of its type). A packaged row that ``check`` refuses is an error of its package.

So a tuned profile's rows come first, and calls outside the regions it measured keep the shipped rows.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from magi2_core import config
from magi2_core.errors import ProfileError
from magi2_core.model.problem import OpName
from magi2_core.profiles.active import (
    DeviceKey,
    Fragment,
    backend_fragments,
    generic_fragments,
    names_device,
    profile_of,
    shipped_profiles,
)
from magi2_core.profiles.model import PlanRow

__all__ = ["PlanCheck", "PlanRows", "every_plan_rows", "plan_rows"]

log = logging.getLogger("magi2_core")

# A provider's check of one of its rows: why the row's plan cannot be read (None: it can).
PlanCheck = Callable[[PlanRow], "str | None"]

_lock = threading.Lock()
_found: dict[tuple[Any, ...], PlanRows] = {}


@dataclass(frozen=True)
class PlanRows:
    """A provider's plan rows for an op on a device, in the order they are tried, and ``source``: where
    they come from (the text a plan's ``why`` opens with)."""

    rows: tuple[PlanRow, ...]
    source: str


def plan_rows(
    op: OpName,
    provider: str,
    device: DeviceKey,
    *,
    profile: str | None = None,
    check: PlanCheck | None = None,
    backends: Sequence[Fragment] | None = None,
) -> PlanRows:
    """``provider``'s rows for ``op`` on ``device`` (module docstring), read once per configuration.

    ``profile``: a profile named as ``MAGI2_PROFILE`` names one, used in its place (explain's
    ``--profile``); ``backends``: the backends' fragments (default: the process registry's). Raises
    :class:`ProfileError` naming the fragment and row where ``check`` refuses a packaged row.
    """
    if backends is None:
        backends = backend_fragments()
    key = (op, provider, device, profile, check, tuple(f.origin for f in backends))
    found = _found.get(key)
    if found is None:
        found = _plan_rows(op, provider, device, profile, check, backends)
        with _lock:
            _found[key] = found
    return found


def every_plan_rows(
    device: DeviceKey, *, profile: str | None = None, backends: Sequence[Fragment] | None = None
) -> list[tuple[OpName, str, PlanRows]]:
    """Per op and provider with rows for ``device`` (in any profile it may read), the rows it reads there:
    what ``magi2 tune --show`` lists (unchecked: a provider skips a row of its own it cannot read)."""
    if backends is None:
        backends = backend_fragments()
    loaded = profile_of(device, backends, profile=profile)
    pairs = sorted(
        {(r.op, r.provider) for f in (*loaded.fragments, *shipped_profiles(), *backends) for r in f.profile.plans}
    )
    out = [
        (op, provider, plan_rows(op, provider, device, profile=profile, backends=backends)) for op, provider in pairs
    ]
    return [(op, provider, found) for op, provider, found in out if found.rows]


def reset_plan_rows() -> None:
    """Forget every answer (the profiles' reset calls this)."""
    with _lock:
        _found.clear()


config.on_reload(reset_plan_rows)


def _plan_rows(
    op: OpName,
    provider: str,
    device: DeviceKey,
    profile: str | None,
    check: PlanCheck | None,
    backends: Sequence[Fragment],
) -> PlanRows:
    loaded = profile_of(device, backends, profile=profile)
    own = []
    for i, row in enumerate(r for r in loaded.own_plans() if r.op == op and r.provider == provider):
        error = check(row) if check is not None else None
        if error is not None:  # a hand-edited file: the other rows still serve
            log.warning(
                "magi2_core: ignoring plan row %s of profile %s (%s): %s",
                row.id or i,
                loaded.name,
                " + ".join(loaded.origins),
                error,
            )
            continue
        own.append(row)
    rows, source = _packaged(op, provider, device, loaded.generic, check, backends)
    if not own:
        return PlanRows(rows, source)
    own_source = f"profile {loaded.name} ({loaded.source}: {' + '.join(loaded.origins)})"
    return PlanRows((*own, *rows), f"{own_source} rows 1-{len(own)}, then {source}")


def _packaged(
    op: OpName, provider: str, device: DeviceKey, generic: bool, check: PlanCheck | None, backends: Sequence[Fragment]
) -> tuple[tuple[PlanRow, ...], str]:
    """The packaged rows for the device itself (module docstring, step 2) and where they come from."""
    every = [*shipped_profiles(), *backends]
    named = [] if generic else [f for f in every if names_device(f, device) and f.profile.plans_for(op, provider)]
    if named:
        rows = _checked(named, op, provider, check)
        names, files = " + ".join(f.profile.name for f in named), " + ".join(f.file for f in named)
        return rows, f"profile {names} ({files}, measured on this device model)"
    generics = [f for f in generic_fragments(device, every) if f.profile.plans_for(op, provider)]
    if not generics:
        return (), f"no profile has plan rows of {provider} for {op} on {device}"
    frag = generics[0]
    known = f" for {_device(device)}" if device.name else ""
    return _checked([frag], op, provider, check), (
        f"generic rows {frag.profile.name} ({frag.file}): no rows measured{known}; `magi2 tune` measures this device"
    )


def _checked(frags: Sequence[Fragment], op: OpName, provider: str, check: PlanCheck | None) -> tuple[PlanRow, ...]:
    out: list[PlanRow] = []
    for frag in frags:
        for i, row in enumerate(frag.profile.plans_for(op, provider), 1):
            error = check(row) if check is not None else None
            if error is not None:
                raise ProfileError(frag.origin, f"plans row {i} of {provider} for {op}: {error}")
            out.append(row)
    return tuple(out)


def _device(device: DeviceKey) -> str:
    """``cuda 'NVIDIA H20' 9.0``: a device as a plan's ``why`` names it."""
    return f"{device.type} {device.name!r}" + (f" {device.capability}" if device.capability else "")
