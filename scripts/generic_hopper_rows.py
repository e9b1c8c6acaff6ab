"""Write the Triton MoE's generic Hopper rows (``generic-cuda-sm90.json``) from two devices' measurements.

The candidates are the NVIDIA H200's measured rows (``nvidia-h200.json``), in their order. A row is
judged at every grid point of ``benchmarks/profile_check.py`` that *reaches* it: the row's ``when``
holds, its plan (its ``align`` made concrete as the provider does on CUDA) was timed at that point
(a plan the check did not time cannot run there), and no earlier row that holds and was timed there
would be taken first on any Triton build that can run this row: one of a more portable kernel
(``two_kernel`` runs every shape, ``one_kernel`` needs less than ``tma``, which needs less than the
Gluon kernels; ``tiles.py``), or of the same kernel other than ``gluon_routed``, which is passed
over for a route-list budget. Where a row is reached it is compared with the fastest plan timed
there that could still run where it is reached (its own kernel or a more portable one).

A row is kept when, on every device, its worst ratio over that device's check runs is within
``BAR``; dropped when it is slower on either device; kept as unmeasured when no grid point reaches
it on either device (the FP32 row, the 17-64 routes-per-expert region), its provenance saying so.

    python scripts/generic_hopper_rows.py          # rewrite the fragment, print each row's verdict
    python scripts/generic_hopper_rows.py --check  # exit 1 if the committed fragment is stale
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from magi2_core.model.problem import Feature, Problem, with_routes_per_expert
from magi2_core.profiles.model import PlanRow

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PROFILES = ROOT / "backends" / "triton" / "src" / "magi2_backend_triton" / "profiles"
CANDIDATES = PROFILES / "nvidia-h200.json"
OUT = PROFILES / "generic-cuda-sm90.json"
BAR = 1.25
# Each device's check runs (every profile judged: the plan candidates are timed in each run).
DEVICES: dict[str, tuple[str, ...]] = {
    "NVIDIA H200": (
        "profile_check_generic_h200.json",
        "profile_check_shipped_h200.json",
        "profile_check_tuned_h200.json",
    ),
    "NVIDIA H100 80GB HBM3": (
        "profile_check_generic_h100.json",
        "profile_check_generic_h100_run1.json",
        "profile_check_h200_h100.json",
        "profile_check_shipped_h100.json",
        "profile_check_tuned_h100.json",
    ),
}
# Portability: a kernel runs wherever one of a higher rank does (tiles.py: the variants' requirements).
RANK = {"two_kernel": 0, "one_kernel": 1, "tma": 2, "gluon": 3, "gluon_routed": 3, "gluon_ws": 3}
RENAMED = {"pointer": "one_kernel"}  # variant names in checks recorded before a rename
STABLE_KERNELS_MAX_EXPERTS = 1024  # magi2_backend_triton.moe.plan: the ``device`` alignment rule


Key = tuple[str, frozenset[tuple[str, int]], str]


@dataclass(frozen=True)
class Point:
    """One grid point of one check run: its problem and the p50 of every plan timed there."""

    id: str
    problem: Problem
    ms: dict[Key, float]


def plan_key(text: str) -> Key:
    """A plan as ``Plan.describe`` writes it: ``variant (K=V, ...), align A``."""
    m = re.fullmatch(r"(\w+) \((.*)\), align (\w+)", text)
    if m is None:
        raise ValueError(f"not a plan description: {text!r}")
    tile = frozenset((k, int(v)) for k, v in (kv.split("=") for kv in m.group(2).split(", ")))
    return RENAMED.get(m.group(1), m.group(1)), tile, m.group(3)


def concrete(row: PlanRow, problem: Problem) -> Key:
    """The row's plan with its alignment as the provider makes it concrete on CUDA (not the interpreter)."""
    plan = row.plan
    det = Feature.DETERMINISTIC in problem.features
    align = str(plan["align"])
    if align == "device":
        flat = (problem.num_heads or 1) * (problem.num_experts or 1)
        align = "stable_kernels" if det or flat <= STABLE_KERNELS_MAX_EXPERTS else "atomic"
    elif align == "atomic" and det:
        align = "stable_kernels"
    tile = plan["tile"]
    assert isinstance(tile, dict)
    return str(plan["variant"]), frozenset((str(k), int(v)) for k, v in tile.items()), align  # type: ignore[arg-type]


def points(files: tuple[str, ...]) -> list[Point]:
    out = []
    for name in files:
        for p in json.loads((RESULTS / name).read_text())["points"]:
            if p["op"] == "moe_experts" and p.get("plans"):
                ms = {plan_key(k): v["p50"] for k, v in p["plans"].items()}
                out.append(Point(f"{name}: {p['id']}", with_routes_per_expert(Problem(**p["problem"])), ms))
    return out


def _runs(row: PlanRow, point: Point) -> bool:
    return row.matches(point.problem) and concrete(row, point.problem) in point.ms


def _first(earlier: PlanRow, row: PlanRow) -> bool:
    """Would ``earlier`` be taken before ``row`` wherever ``row`` can run (module docstring)?"""
    a, b = RANK[str(earlier.plan["variant"])], RANK[str(row.plan["variant"])]
    return a < b or (a == b and earlier.plan["variant"] != "gluon_routed")


def ratios(rows: list[PlanRow], index: int, pts: list[Point]) -> list[tuple[str, float]]:
    """``rows[index]``'s time over the fastest plan that could run where it is reached, per point reaching it."""
    row, out = rows[index], []
    for point in pts:
        if not _runs(row, point) or any(_runs(e, point) and _first(e, row) for e in rows[:index]):
            continue
        rank = RANK[str(row.plan["variant"])]
        best = min(ms for key, ms in point.ms.items() if RANK[key[0]] <= rank)
        out.append((point.id, point.ms[concrete(row, point.problem)] / best))
    return out


def judged(candidates: dict[str, Any], devices: dict[str, list[Point]]) -> list[tuple[dict[str, Any], str]]:
    """Each candidate row (as JSON) with its verdict: "kept", "unmeasured" or "dropped: ..."."""
    rows = [PlanRow.model_validate(r) for r in candidates["plans"]]
    out = []
    for i, raw in enumerate(candidates["plans"]):
        worst = {dev: max((r for _, r in ratios(rows, i, pts)), default=None) for dev, pts in devices.items()}
        slow = [f"{dev} {w:.3f}x" for dev, w in worst.items() if w is not None and w > BAR]
        measured = [f"{dev} {w:.3f}x" for dev, w in worst.items() if w is not None]
        if slow:
            verdict = f"dropped: slower than {BAR}x the fastest on {', '.join(slow)}"
        elif len(measured) == len(devices):
            verdict = f"kept: worst {' / '.join(measured)}"
        else:
            verdict = "unmeasured" + (f" (reached on {', '.join(measured)} only)" if measured else "")
        out.append((raw, verdict))
    return out


def _device_files() -> str:
    return "; ".join(f"{dev}: {', '.join(files)}" for dev, files in DEVICES.items())


def render() -> str:
    candidates = json.loads(CANDIDATES.read_text())
    devices = {dev: points(files) for dev, files in DEVICES.items()}
    names = " and the ".join(DEVICES)
    plans = []
    for raw, verdict in judged(candidates, devices):
        if verdict.startswith("dropped"):
            continue
        row = {k: v for k, v in raw.items() if k != "provenance"}
        source = raw.get("provenance", {}).get("source", "")
        if verdict.startswith("kept"):
            row["provenance"] = {
                "kind": "benchmark",
                "source": "benchmarks/results/profile_check_*_h200.json, *_h100*.json",
                "tool": "scripts/generic_hopper_rows.py",
                "note": f"the H200's row ({source}), {verdict.removeprefix('kept: ')} of the fastest plan that can "
                f"run where it is reached (bar {BAR}x)",
            }
        else:
            row["provenance"] = {
                "kind": "policy",
                "source": "magi2_backend_triton/profiles/nvidia-h200.json",
                "note": f"the H200's row ({source}); {verdict}: no point of the check grid reaches it on the {names}",
            }
        plans.append(row)
    doc = {
        "format": "magi2-profile",
        "version": 1,
        "name": "generic-cuda-sm90",
        "device": {"type": "cuda", "capability": "9"},
        "libraries": candidates["libraries"],
        "provenance": {
            "kind": "policy",
            "source": "magi2_backend_triton/profiles/nvidia-h200.json",
            "tool": "scripts/generic_hopper_rows.py",
            "note": f"any CUDA 9.x device without rows of its own: the H200's rows within {BAR}x of the fastest "
            f"plan on both devices checked, the {names} (the check runs: {_device_files()}); rows no "
            f"grid point reaches are kept and say so; an H20 or any other 9.x device is unmeasured",
        },
        "preferences": [],
        "plans": plans,
    }
    return json.dumps(doc, indent=1) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is stale: run python scripts/generic_hopper_rows.py", file=sys.stderr)
            return 1
        return 0
    devices = {dev: points(files) for dev, files in DEVICES.items()}
    for i, (raw, verdict) in enumerate(judged(json.loads(CANDIDATES.read_text()), devices), 1):
        print(f"row {i} {raw['plan']['variant']} {raw['plan']['align']}: {verdict}")
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
