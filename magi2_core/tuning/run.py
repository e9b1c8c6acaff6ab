"""One ``magi2 tune`` run: measure the grid (resumably), cut the regions, write the profile."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from magi2_core.model.devices import device_identity
from magi2_core.model.problem import OPS, OpName
from magi2_core.profiles.active import DeviceKey, active_profile
from magi2_core.profiles.model import Profile
from magi2_core.tools.timing import Timer
from magi2_core.tuning.grid import Shape
from magi2_core.tuning.measure import PointResult, measure_point
from magi2_core.tuning.session import Session
from magi2_core.tuning.write import build_profile, default_path, write_profile

__all__ = ["TuneRun", "device_key", "tune"]

Progress = Callable[[int, int, str], None]  # (points done, points in all, the point being measured)


@dataclass(frozen=True)
class TuneRun:
    """What a run did: the profile written and where, the points (measured now or resumed)."""

    profile: Profile
    path: Path
    results: tuple[PointResult, ...]
    measured: int
    resumed: int
    seconds: float
    note: str = ""


def device_key(device: str) -> DeviceKey:
    """The device as profiles key it (its name and capability as torch reports them; the type alone names a CPU)."""
    kind, _, index = device.partition(":")
    name, capability = device_identity(kind, int(index) if index else None)
    return DeviceKey(kind, name or kind, capability)


def tune(
    points: Sequence[Shape],
    *,
    device: str = "cuda",
    reps: int = 10,
    warmup: int = 2,
    out: Path | None = None,
    fresh: bool = False,
    timer: Timer | None = None,
    command: str = "magi2 tune",
    progress: Progress | None = None,
    key: DeviceKey | None = None,
    note: str = "",
) -> TuneRun:
    """Measure ``points`` on ``device`` and write a profile for it (``out``: default :func:`default_path`).

    Points already in ``<out>.partial`` (a run that stopped) are not measured again unless ``fresh``.
    ``timer``: the harness's timer (default: device events; tests inject a fake one). ``key``: the
    device as the profile names it (default: as torch reports it). ``note``: added to the provenance note.
    """
    if reps < 1 or warmup < 0:
        raise ValueError(f"reps must be at least 1 and warmup at least 0; got {reps} and {warmup}")
    key = key or device_key(device)
    base = active_profile(device)
    path = Path(out) if out is not None else default_path(key)
    session = Session(path, key, fresh=fresh)
    ids = [p.id for p in points]
    resumed = len(ids) - len(session.pending(ids))
    started = time.perf_counter()
    for i, shape in enumerate(points):
        if shape.id in session.done:
            continue
        if progress is not None:
            progress(i, len(points), shape.id)
        session.record(measure_point(shape, device=device, reps=reps, warmup=warmup, timer=timer))
    if progress is not None:
        progress(len(points), len(points), "")
    results = tuple(session.done[i] for i in ids)
    ops: list[OpName] = [op for op in OPS if any(p.op == op for p in points)]
    profile = build_profile(results, ops, key, base, command=command, reps=reps, warmup=warmup, note=note)
    write_profile(profile, path)
    session.finish()
    return TuneRun(profile, path, results, len(ids) - resumed, resumed, time.perf_counter() - started, session.note)
