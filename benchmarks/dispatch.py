"""Registry overhead per op call (host time): cached resolution, and what a public call adds to a provider call.

    python -m benchmarks.dispatch [--device cpu|cuda] [--out PATH]   # prints a table, writes the JSON

``--device cuda`` puts every input on the GPU (the serving path; default out dispatch_cuda.json),
``--device cpu`` keeps them on the host (default out dispatch_cpu.json).

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
from magi2_core.tools.overhead import DEVICES, dispatch_overhead

_METHOD = (
    "best of 5 repeats of N back-to-back calls, tiny tensors on the inputs' device, against a no-op provider "
    "registered for the measurement; added = public - direct (validation + cached resolution + plumbing); "
    "moe_experts with host expert ids scans the ids' values on every call (a range check: one aminmax and "
    "two reads), device ids are not value-checked per call; attention's host prefix sums are keyed by value, "
    "device ones (max_seqlen_* given) by shape; added_inference_us: the same under torch.inference_mode "
    "(how vllm-omni runs MAGI-2), where no input's requires_grad is read"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=DEVICES, default="cpu", help="where every input lives")
    ap.add_argument("--out", type=Path, help="the JSON to write (default: results/dispatch_<device>.json)")
    args = ap.parse_args()
    device: str = args.device
    torch.set_num_threads(1)
    rows = dispatch_overhead(iters=20000, device=device)
    commit = git_commit()
    result = {
        "benchmark": "dispatch_overhead",
        "device": f"cpu: {platform.processor() or platform.machine()} ({torch.get_num_threads()} thread)",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "magi2_core": magi2_core.__version__,
        "commit": commit,
        "inputs_device": _inputs_device(device),
        "method": _METHOD,
        "rows": rows,
    }
    out: Path = args.out or default_out(device)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for r in rows:
        print(
            f"{r['op']:>10}: resolve {r['resolve_us']:.2f} us  public {r['public_us']:.2f} us  "
            f"direct {r['direct_us']:.2f} us  added {r['added_us']:.2f} us "
            f"({r['added_inference_us']:.2f} us under inference_mode)"
        )
    print(f"wrote {out}")


def default_out(device: str) -> Path:
    return Path(__file__).parent / "results" / f"dispatch_{device}.json"


def _inputs_device(device: str) -> str:
    if device == "cuda":
        return f"cuda: {torch.cuda.get_device_name()}"
    return "cpu"


if __name__ == "__main__":
    main()
