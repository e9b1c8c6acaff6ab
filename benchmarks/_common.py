"""Helpers every benchmark shares: timing, L2 flush, statistics and the environment record.

Timing: each function is warmed up first (Triton compiles, caches fill), then calls alternate
between the variants in a rotating order so none always follows the same neighbour. Before every
call a buffer larger than the L2 is zeroed (outside the timed region), and each call is timed with
its own pair of CUDA events. On the CPU (dry runs of a script's plumbing) the host clock is used.

Statistics are nearest-rank percentiles: every reported value is one of the samples. Empty input,
NaN, infinite, zero or negative times are errors (a broken timer, not a fast kernel).
"""

from __future__ import annotations

import datetime
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = ["env_record", "flush_l2", "git_commit", "percentile", "stats", "time_alternating", "time_loop"]

FLUSH_BYTES = 256 * 2**20  # > 4x the H200's 60 MB L2
_flush_bufs: dict[tuple[str, int], torch.Tensor] = {}


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
        buf = _flush_bufs[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    buf.zero_()


def _synchronize(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


def time_alternating(
    fns: Mapping[str, Callable[[], object]],
    iters: int,
    *,
    warmup: int = 3,
    device: str = "cuda",
    flush: bool = True,
    flush_bytes: int = FLUSH_BYTES,
) -> dict[str, list[float]]:
    """Milliseconds per call of each function: warm-up, then ``iters`` rounds in rotating order, the L2
    flushed before each call, one pair of device events per call (host clock on the CPU)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    _synchronize(device)
    names = list(fns)
    events: dict[str, list[tuple[Any, Any]]] = {n: [] for n in names}
    host: dict[str, list[float]] = {n: [] for n in names}
    for i in range(iters):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            if flush:
                flush_l2(device, flush_bytes)
            if device == "cpu":
                t0 = time.perf_counter()
                fns[name]()
                host[name].append((time.perf_counter() - t0) * 1e3)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name]()
            end.record()
            events[name].append((start, end))
    if device == "cpu":
        return host
    torch.cuda.synchronize()
    return {n: [s.elapsed_time(e) for s, e in ev] for n, ev in events.items()}


def time_loop(
    fns: Mapping[str, Callable[[], object]], reps: int, loop: int, *, device: str = "cuda"
) -> dict[str, list[float]]:
    """Milliseconds per call over ``loop`` back-to-back calls (no flush): the steady cost in an eager
    model, host overhead included where the host is the bottleneck. ``reps`` samples per function."""
    out: dict[str, list[float]] = {n: [] for n in fns}
    names = list(fns)
    for r in range(reps):
        for name in names if r % 2 == 0 else names[::-1]:
            _synchronize(device)
            if device == "cpu":
                t0 = time.perf_counter()
                for _ in range(loop):
                    fns[name]()
                out[name].append((time.perf_counter() - t0) * 1e3 / loop)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(loop):
                fns[name]()
            end.record()
            torch.cuda.synchronize()
            out[name].append(start.elapsed_time(end) / loop)
    return out


def graphed(fn: Callable[[], object], device: str = "cuda") -> Callable[[], object]:
    """``fn`` captured in one CUDA graph after two warm-up calls on a side stream; its replay is the
    returned callable (CPU: ``fn`` itself)."""
    if device == "cpu":
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def git_commit() -> str:
    """``MAGI2_GIT_COMMIT`` or ``GIT_COMMIT`` when set (a copied tree without .git), else ``git rev-parse``."""
    for var in ("MAGI2_GIT_COMMIT", "GIT_COMMIT"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def env_record(device: str = "cuda") -> dict[str, Any]:
    """Device, versions, commit and UTC date: what a result file needs to be compared with another."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    rec: dict[str, Any] = {
        "device": "cpu" if device == "cpu" else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if device != "cpu":
        rec["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
    return rec
