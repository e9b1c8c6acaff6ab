"""Registry overhead on the CPU: cached resolution, and what a public op call adds to a direct provider call.

    python benchmarks/dispatch.py            # prints a table, writes benchmarks/results/dispatch_cpu.json

Targets: <= 2 us cached resolve, <= 5 us added to a direct provider call, for every op (quiet machine).
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path

import torch

import magi2_core
from magi2_core.bench import dispatch_overhead


def main() -> None:
    torch.set_num_threads(1)
    rows = dispatch_overhead(iters=20000)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or "unknown"
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
    out = Path(__file__).parent / "results" / "dispatch_cpu.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(f"{r['op']:>10}: resolve {r['resolve_us']:.2f} us  public {r['public_us']:.2f} us  "
              f"direct {r['direct_us']:.2f} us  added {r['added_us']:.2f} us")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
