"""One timing harness for ``magi2 tune`` and the benchmarks: device events, L2 flush, alternation, spread.

Before a process's first measurement on a device, the device is kept busy for a quarter second
(:func:`spin_up`): an idle GPU runs at a fraction of its clock, and the first candidates timed would
see it ramp up. Each function is warmed up (Triton compiles, caches fill); then ``reps`` rounds call
every function once, in an order rotated by one each round, so none always follows the same neighbour.
Before every call a buffer larger than the L2 is zeroed (outside the timed region). Each call is
timed by a :class:`Timer`: device events around the call on a GPU (:class:`EventTimer`), the host
clock on the CPU (:class:`HostTimer`, for dry runs of the plumbing), or whatever a test injects.

Statistics are nearest-rank percentiles (every reported value is one of the samples): the median
``p50`` and the spread ``p10``..``p90``. Empty input, NaN, infinite, zero or negative times are
errors (a broken timer, not a fast kernel).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

__all__ = [
    "FLUSH_BYTES",
    "SPIN_UP_SECONDS",
    "EventTimer",
    "HostTimer",
    "Reading",
    "Timer",
    "default_timer",
    "flush_l2",
    "measure",
    "percentile",
    "spin_up",
    "stats",
    "time_alternating",
]

FLUSH_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2
SPIN_UP_SECONDS = 0.25  # of back-to-back matrix products before a process's first measurement on a device
_flush_bufs: dict[tuple[str, int], Any] = {}
_spun: set[str] = set()

Reading = Callable[[], float]
"""A call's time in milliseconds, read after :meth:`Timer.synchronize` (device events resolve late)."""


class Timer(Protocol):
    """Times one call; what the harness is given (tests inject a fake one)."""

    def time(self, label: str, fn: Callable[[], object]) -> Reading:
        """Call ``fn`` once and return how to read its duration (ms) once the device is synchronized.
        ``label`` names the call (``"<context>/<name>"``), for timers that fake durations."""
        ...

    def synchronize(self) -> None:
        """Wait until every call timed so far has finished."""
        ...


class EventTimer:
    """A pair of CUDA (or MUSA) events around each call: device time, host overhead hidden when the
    host runs ahead of the device."""

    def __init__(self, device: str = "cuda") -> None:
        import torch

        self._mod = getattr(torch, device.split(":")[0])

    def time(self, label: str, fn: Callable[[], object]) -> Reading:
        start, end = self._mod.Event(enable_timing=True), self._mod.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return lambda: float(start.elapsed_time(end))

    def synchronize(self) -> None:
        self._mod.synchronize()


class HostTimer:
    """The host clock around each call (CPU runs, where the call is synchronous)."""

    def time(self, label: str, fn: Callable[[], object]) -> Reading:
        t0 = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t0) * 1e3
        return lambda: ms

    def synchronize(self) -> None:
        return None


def default_timer(device: str) -> Timer:
    """Device events on a GPU, the host clock on the CPU."""
    return HostTimer() if device == "cpu" else EventTimer(device)


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` in [0, 100] of already sorted samples (rank ``ceil(q/100·n)``, at least 1)."""
    if not ordered:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100]; got {q}")
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def stats(samples: Sequence[float]) -> dict[str, float]:
    """p10/p50/p90 (nearest rank), min, max, mean and n of positive, finite times (ms)."""
    values = [float(v) for v in samples]
    if not values:
        raise ValueError("stats: no samples (the benchmark timed nothing)")
    bad = [v for v in values if not math.isfinite(v) or v <= 0.0]
    if bad:
        raise ValueError(f"stats: times must be finite and positive; got {bad[:5]} among {len(values)} samples")
    s = sorted(values)
    return {
        "p10": percentile(s, 10),
        "p50": percentile(s, 50),
        "p90": percentile(s, 90),
        "min": s[0],
        "max": s[-1],
        "mean": sum(s) / len(s),
        "n": len(s),
    }


def flush_l2(device: str = "cuda", nbytes: int = FLUSH_BYTES) -> None:
    """Zero ``nbytes`` on ``device`` so the next call finds none of its data in the L2 (no-op on CPU)."""
    if device == "cpu":
        return
    key = (device, nbytes)
    buf = _flush_bufs.get(key)
    if buf is None:
        import torch

        buf = _flush_bufs[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    buf.zero_()


def spin_up(device: str = "cuda", seconds: float = SPIN_UP_SECONDS) -> None:
    """Keep ``device`` busy for ``seconds`` of matrix products, once per process and device, so that
    its clocks have left the idle state before anything is timed (no-op on CPU and after the first call)."""
    if device == "cpu" or device in _spun:
        return
    import torch

    mod = getattr(torch, device.split(":")[0])
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(8):
            a = (a @ a).clamp_(-1.0, 1.0)
        mod.synchronize()
    _spun.add(device)


def time_alternating(
    fns: Mapping[str, Callable[[], object]],
    iters: int,
    *,
    warmup: int = 3,
    device: str = "cuda",
    flush: bool = True,
    flush_bytes: int = FLUSH_BYTES,
    timer: Timer | None = None,
    label: str = "",
) -> dict[str, list[float]]:
    """Milliseconds per call of each function: ``warmup`` calls each, then ``iters`` rounds in rotating
    order, the L2 flushed before each call, each call timed by ``timer`` (default: :func:`default_timer`).
    ``label`` prefixes the names the timer sees (``"<label>/<name>"``)."""
    timer = timer or default_timer(device)
    if isinstance(timer, EventTimer):  # a real device: not a host dry run nor an injected fake
        spin_up(device)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    timer.synchronize()
    names = list(fns)
    readings: dict[str, list[Reading]] = {n: [] for n in names}
    for i in range(iters):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            if flush:
                flush_l2(device, flush_bytes)
            readings[name].append(timer.time(f"{label}/{name}" if label else name, fns[name]))
    timer.synchronize()
    return {n: [r() for r in rs] for n, rs in readings.items()}


def measure(
    fns: Mapping[str, Callable[[], object]],
    reps: int,
    *,
    warmup: int = 2,
    device: str = "cuda",
    timer: Timer | None = None,
    label: str = "",
) -> dict[str, dict[str, float]]:
    """:func:`time_alternating`, summarised by :func:`stats` per function (median ``p50``, spread ``p10``/``p90``)."""
    if reps < 1:
        raise ValueError(f"measure: reps must be at least 1; got {reps}")
    samples = time_alternating(fns, reps, warmup=warmup, device=device, timer=timer, label=label)
    return {name: stats(values) for name, values in samples.items()}
