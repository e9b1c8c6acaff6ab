"""Run a function on ``world`` CPU processes joined by a gloo process group.

Processes are forked (spawn would re-import torch in every child: ~10 s instead of ~1 s on two
cores) and use one intra-op thread each, which also keeps libgomp's fork restriction out of play.
The group meets through a file store in a fresh directory, so no port can collide. A failure in any
rank fails the test with every failing rank's traceback (the first rank to fail is usually the cause,
the others then see their peer's connection close); a hang is killed after ``timeout_s``.
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

START_METHOD = "fork" if sys.platform.startswith("linux") else "spawn"


def _entry(rank: int, world: int, tmp: str, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{os.path.join(tmp, 'store')}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        fn(rank, world, *args)
        dist.barrier()
    except BaseException:
        with open(os.path.join(tmp, f"rank{rank}.err"), "w") as f:
            f.write(f"{time.monotonic():.6f}\n{traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()


def _rank_errors(tmp: str, world: int) -> str:
    found = []
    for r in range(world):
        path = os.path.join(tmp, f"rank{r}.err")
        if os.path.exists(path):
            with open(path) as f:
                stamp, _, text = f.read().partition("\n")
            found.append((float(stamp), f"--- rank {r} ---\n{text}"))
    return "\n".join(text for _, text in sorted(found))  # earliest failure first


def run_world(world: int, fn: Callable[..., None], *args: Any, timeout_s: float = 120.0) -> None:
    """Call ``fn(rank, world, *args)`` on ``world`` gloo ranks; raise if any rank fails or hangs."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(
            _entry, args=(world, tmp, fn, args), nprocs=world, join=False, start_method=START_METHOD
        )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if ctx.join(timeout=0.2):
                    return
            except ProcessException as exc:
                time.sleep(0.5)  # let the other ranks record their errors
                raise AssertionError(f"world {world}: a rank failed\n{_rank_errors(tmp, world)}") from exc
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    if p.is_alive():
                        p.kill()
                raise TimeoutError(f"distributed test with world {world} did not finish in {timeout_s} s")
