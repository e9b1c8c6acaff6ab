"""Helpers every benchmark shares: timing, L2 flush, statistics and the environment record.

The timing harness is ``magi2_core.tools.timing``, the one ``magi2 tune`` uses (warm-up, rotating
alternation, an L2 flush before every call, one pair of device events per call, nearest-rank
p10/p50/p90): its names are re-exported here. This module adds the loop timing (back-to-back calls),
CUDA-graph capture, the environment record of a result file and the device's ceilings.

Ceilings: every fraction a benchmark reports ("0.82 of copy", "of the matmul ceiling") divides by the
ceilings of the device it ran on, measured in the same process by :func:`measure_ceilings` (a copy far
larger than the L2, and a large square BF16 GEMM, timed by the same harness) and recorded in its result
file as ``"ceilings": {"copy_tb_s", "matmul_tflops", "how"}``, beside the device's name.
"""

from __future__ import annotations

import datetime
import functools
import os
import platform
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from magi2_core.tools.timing import FLUSH_BYTES, Timer, flush_l2, measure, percentile, stats, time_alternating

__all__ = [
    "COPY_BYTES",
    "FLUSH_BYTES",
    "MATMUL_N",
    "Ceilings",
    "env_record",
    "flush_l2",
    "git_commit",
    "graphed",
    "measure",
    "measure_ceilings",
    "measure_copy_tbs",
    "measure_matmul_tflops",
    "pack_counter",
    "percentile",
    "stats",
    "time_alternating",
    "time_loop",
]

COPY_BYTES = 2 * 1024**3  # read + written by one copy of a 1 GiB buffer: far larger than any GPU's L2
MATMUL_N = 8192  # a square BF16 GEMM this size runs at the device's dense matmul rate
CEILING_ITERS = 10


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


def in_run_order(modes: Sequence[str], order: Sequence[str]) -> list[str]:
    """The requested ``modes`` in the benchmark's ``order``, each once. vllm-omni's ``compile_regions``
    compiles a model's modules in place and for good, so an eager mode timed after a compiled one would
    time the compiled model under the eager label."""
    unknown = sorted(set(modes) - set(order))
    if unknown:
        raise ValueError(f"unknown modes {unknown}: expected some of {list(order)}")
    return [m for m in order if m in modes]


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


def measure_copy_tbs(
    nbytes: int = COPY_BYTES, iters: int = CEILING_ITERS, *, device: str = "cuda", timer: Timer | None = None
) -> float:
    """Device-to-device copy bandwidth, TB/s: ``nbytes`` (read + written: a buffer of ``nbytes / 2``
    copied) over the p50 of ``iters`` calls of the timing harness."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = time_alternating({"copy": lambda: dst.copy_(src)}, iters, device=device, timer=timer)["copy"]
    return nbytes / (stats(ms)["p50"] * 1e-3) / 1e12


def measure_matmul_tflops(
    n: int = MATMUL_N, iters: int = CEILING_ITERS, *, device: str = "cuda", timer: Timer | None = None
) -> float:
    """Dense BF16 matmul rate, TFLOP/s: an ``n x n`` by ``n x n`` product (2·n³ FLOP) into a preallocated
    output, over the p50 of ``iters`` calls of the timing harness."""
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    ms = time_alternating({"matmul": lambda: torch.mm(a, b, out=c)}, iters, device=device, timer=timer)["matmul"]
    return 2.0 * n**3 / (stats(ms)["p50"] * 1e-3) / 1e12


@dataclass(frozen=True)
class Ceilings:
    """This device's copy bandwidth and dense BF16 matmul rate, measured in the run whose fractions divide by them."""

    copy_tb_s: float
    matmul_tflops: float
    how: str

    def record(self) -> dict[str, float | str]:
        """The result file's ``"ceilings"`` entry."""
        return {"copy_tb_s": self.copy_tb_s, "matmul_tflops": self.matmul_tflops, "how": self.how}


@functools.cache
def measure_ceilings(device: str = "cuda") -> Ceilings:
    """The ceilings of the CUDA device ``device``, measured once per process (later calls return the same
    record). A benchmark's dry run on the CPU has no device ceilings: it records none and reports no
    fractions, and asking for them there is an error."""
    if not device.startswith("cuda"):
        raise ValueError(
            f"measure_ceilings: {device!r} is not a CUDA device; the ceilings are a GPU's copy and "
            "matmul rates (a dry run on the CPU records no ceilings: pass None where they go)"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(
            "measure_ceilings: no CUDA device here (torch.cuda.is_available() is False); run the "
            "benchmark on the GPU whose ceilings its fractions divide by"
        )
    how = (
        f"copy: {COPY_BYTES / 2**30:g} GiB read + written by one device-to-device copy, over the p50 of "
        f"{CEILING_ITERS} calls; matmul: {MATMUL_N}^3 BF16 torch.mm, 2*{MATMUL_N}^3 FLOP over the p50 of "
        f"{CEILING_ITERS} calls; each call after an L2 flush, timed by device events (magi2_core.tools.timing)"
    )
    return Ceilings(measure_copy_tbs(device=device), measure_matmul_tflops(device=device), how)


@functools.cache
def pack_counter() -> Callable[[], int] | None:
    """A count of the gate/up banks the Triton backend builds from now on in this process (its
    ``pack_w13`` wrapped where the backend calls it), or None without that backend."""
    try:
        from magi2_backend_triton import providers
        from magi2_backend_triton.moe import fused, pack
    except ImportError:
        return None
    built = [0]
    real = pack.pack_w13

    def counting(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
        built[0] += 1
        return real(w_gate, w_up)

    fused.pack_w13 = providers.pack_w13 = counting  # type: ignore[attr-defined]
    return lambda: built[0]
