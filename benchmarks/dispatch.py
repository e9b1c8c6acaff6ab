"""Registry overhead on the CPU: cached resolution, and what a public op call adds to a direct provider call.

    python -m benchmarks.dispatch [--out benchmarks/results/dispatch_cpu.json]   # prints a table, writes the JSON

Targets: <= 2 us cached resolve, <= 5 us added to a direct provider call, for every op (quiet machine).
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

import magi2_core
from benchmarks._common import git_commit
from magi2_core.bench import dispatch_overhead


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "dispatch_cpu.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = dispatch_overhead(iters=20000)
    commit = git_commit()
    result = {
        "benchmark": "dispatch_overhead",
        "device": f"cpu: {platform.processor() or platform.machine()} ({torch.get_num_threads()} thread)",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "magi2_core": magi2_core.__version__,
        "commit": commit,
        "method": "best of 5 repeats of N back-to-back calls, tiny CPU tensors, against a no-op provider registered for the measurement; added = public - direct (validation + cached resolution + plumbing)",
        "rows": rows,
    }
    out: Path = args.out
    out.write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(f"{r['op']:>10}: resolve {r['resolve_us']:.2f} us  public {r['public_us']:.2f} us  "
              f"direct {r['direct_us']:.2f} us  added {r['added_us']:.2f} us")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
