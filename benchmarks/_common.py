"""Helpers every benchmark shares: timing, L2 flush, statistics and the environment record.

The timing harness is ``magi2_core.timing``, the one ``magi2 tune`` uses (warm-up, rotating
alternation, an L2 flush before every call, one pair of device events per call, nearest-rank
p10/p50/p90): its names are re-exported here. This module adds the loop timing (back-to-back calls),
CUDA-graph capture and the environment record of a result file.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from magi2_core.timing import FLUSH_BYTES, flush_l2, measure, percentile, stats, time_alternating

__all__ = ["FLUSH_BYTES", "env_record", "flush_l2", "git_commit", "graphed", "measure", "percentile", "stats",
           "time_alternating", "time_loop"]


def _synchronize(device: str) -> None:
    if device != "cpu":
        torch.cuda.synchronize()


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
