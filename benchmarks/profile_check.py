"""Does the active profile pick the fastest? The resolved call against every eligible provider, per grid point.

For each point of the grid (``magi2 tune``'s default, or ``--shapes FILE``), in one alternating run of
the harness (``magi2_core.tools.timing``, the one ``magi2 tune`` uses): the resolved call (no
``provider=``, so the active profile decides: choose it with ``MAGI2_PROFILE``), every eligible
provider forced by ``provider=``, and, for a provider that runs explicit plans (the Triton MoE),
every plan candidate and the plan the profile resolves to, through ``run_plan``.

Per point, what is judged is the *choice*, every term timed the same way: ``choice_ratio`` = the
resolved provider forced with ``provider=`` / the fastest eligible provider forced the same way, and
for planned providers ``plan_ratio`` = the resolved plan / the fastest plan (``run_plan`` both). A
point passes when both are within ``--bar`` (default 1.03; 1.25 under ``MAGI2_PROFILE=generic``).
The resolved call itself is timed beside them and reported, not judged: ``call_ratio`` = resolved
call / fastest forced provider, and ``call_overhead_ms`` = resolved call - its own provider forced.
Where the profile picks the fastest provider those two differ from 1 and 0 only by the resolution
step (``magi2 overhead`` measures it, a few microseconds) and by timing noise, which at a short,
launch-bound call exceeds 3% (a call compared with itself would fail the bar by chance). The
eager ``reference`` is never timed (at production sizes it needs more memory and time than any
check should spend): a call that resolves to it while another provider is eligible fails as
"fell to the reference"; a point only the reference can serve is reported as such.

    MAGI2_PROFILE=generic python -m benchmarks.profile_check --out check_generic.json [--reps 10]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common import env_record
from magi2_core.tools.timing import measure
from magi2_core.tuning.grid import Shape, default_grid, load_shapes, select_ops
from magi2_core.tuning.measure import REFERENCE, PlanRunner, plan_fns, plan_key, prepare, working

TUNED_BAR = 1.03
GENERIC_BAR = 1.25


def check_point(
    shape: Shape, *, device: str, reps: int, warmup: int, bar: float, plans: bool = True, timer: Any = None
) -> dict[str, Any]:
    """Time the resolved call, every eligible provider and (``plans``) every plan of ``shape`` in one run."""
    prep = prepare(shape, device)
    timed = [p for p in prep.eligible if p != REFERENCE]
    row: dict[str, Any] = {
        "id": shape.id,
        "op": shape.op,
        "resolved": prep.resolved,
        "eligible": list(prep.eligible),
        "problem": prep.problem.model_dump(mode="json", exclude_none=True),
    }
    if not timed:
        return row | {"ok": True, "why": "only the reference can serve this call here: nothing to choose"}
    if prep.resolved in (None, REFERENCE):
        return row | {"ok": False, "why": f"fell to the reference although {', '.join(timed)} can serve it"}
    fns: dict[str, Callable[[], object]] = {"resolved": prep.built.call(None)}
    fns |= {f"provider {p}": prep.built.call(p) for p in timed}
    resolved_kernel = prep.kernels[prep.resolved]
    resolved_plan = resolved_kernel.plan(prep.problem) if plans and isinstance(resolved_kernel, PlanRunner) else None
    planned = plan_fns(prep, [resolved_plan] if resolved_plan is not None else []) if plans else {}
    fns |= {f"plan {k}": fn for k, (_, _, fn) in planned.items()}
    fns, errors = working(fns)
    if errors:
        row["errors"] = errors
    if "resolved" not in fns:
        return row | {"ok": False, "why": f"the resolved call raised: {errors['resolved']}"}
    timed = [p for p in timed if f"provider {p}" in fns]
    if not timed:
        return row | {"ok": False, "why": f"every eligible provider raised: {errors}"}
    planned = {k: v for k, v in planned.items() if f"plan {k}" in fns}
    ms = measure(fns, reps, warmup=warmup, device=device, timer=timer, label=shape.id)
    fastest = min(timed, key=lambda p: ms[f"provider {p}"]["p50"])
    best_ms = ms[f"provider {fastest}"]["p50"]
    if f"provider {prep.resolved}" not in ms:
        return row | {
            "ms": ms,
            "ok": False,
            "why": f"the resolved provider {prep.resolved} raised when forced: {errors}",
        }
    mine_ms = ms[f"provider {prep.resolved}"]["p50"]
    choice = mine_ms / best_ms
    row |= {
        "ms": ms,
        "fastest_provider": fastest,
        "choice_ratio": choice,
        "call_ratio": ms["resolved"]["p50"] / best_ms,
        "call_overhead_ms": ms["resolved"]["p50"] - mine_ms,
    }
    ok, why = (
        choice <= bar,
        [
            f"resolved {prep.resolved} {mine_ms:.4g} ms, fastest {fastest} {best_ms:.4g} ms "
            f"({choice:.3f}x; the resolved call {ms['resolved']['p50']:.4g} ms)"
        ],
    )
    if resolved_plan is not None:
        mine = [k for k, (prov, _, _) in planned.items() if prov == prep.resolved]
        chosen = next((k for k in mine if plan_key(planned[k][1]) == plan_key(resolved_plan)), None)
        if chosen is None:
            return row | {"ok": False, "why": f"the resolved plan {resolved_plan.describe()} raised: {errors}"}
        best = min(mine, key=lambda k: ms[f"plan {k}"]["p50"])
        plan_ratio = ms[f"plan {chosen}"]["p50"] / ms[f"plan {best}"]["p50"]
        row |= {
            "plan": resolved_plan.describe(),
            "plan_why": resolved_plan.why,
            "fastest_plan": planned[best][1].describe(),
            "plans": {planned[k][1].describe(): ms[f"plan {k}"] for k in mine},
            "plan_ratio": plan_ratio,
        }
        ok = ok and plan_ratio <= bar
        why.append(
            f"plan {resolved_plan.describe()} {plan_ratio:.3f}x the fastest of {len(mine)} "
            f"({planned[best][1].describe()})"
        )
    return row | {"ok": ok, "why": "; ".join(why)}


def _profile_record(device: str) -> dict[str, Any]:
    from magi2_core.profiles import active_profile

    loaded = active_profile(device)
    return {
        "name": loaded.name,
        "source": loaded.source,
        "origins": list(loaded.origins),
        "MAGI2_PROFILE": os.environ.get("MAGI2_PROFILE"),
    }


def run(
    points: Sequence[Shape], *, device: str, reps: int, warmup: int, bar: float, plans: bool, timer: Any = None
) -> dict[str, Any]:
    started = time.perf_counter()
    rows = []
    for i, shape in enumerate(points, 1):
        row = check_point(shape, device=device, reps=reps, warmup=warmup, bar=bar, plans=plans, timer=timer)
        rows.append(row)
        mark = "ok  " if row["ok"] else "FAIL"
        print(f"[{i:2d}/{len(points)}] {mark} {shape.id}: {row['why']}", flush=True)
        if device != "cpu":
            import torch

            torch.cuda.empty_cache()
    failed = [r["id"] for r in rows if not r["ok"]]
    ratios = [r[k] for r in rows for k in ("choice_ratio", "plan_ratio") if k in r]
    return {
        "env": env_record(device),
        "profile": _profile_record(device),
        "bar": bar,
        "reps": reps,
        "warmup": warmup,
        "seconds": round(time.perf_counter() - started, 1),
        "points": rows,
        "summary": {
            "points": len(rows),
            "failed": failed,
            "fell_to_reference": [r["id"] for r in rows if "fell to the reference" in r["why"]],
            "worst_ratio": max(ratios, default=math.nan),
            "worst_call_ratio": max((r["call_ratio"] for r in rows if "call_ratio" in r), default=math.nan),
        },
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON result file")
    ap.add_argument("--shapes", type=Path, help="a JSON file of points (as `magi2 tune --shapes`); default: its grid")
    ap.add_argument("--ops", help="only these ops, comma-separated")
    ap.add_argument("--reps", type=int, default=10, help="timed calls per variant")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls first")
    ap.add_argument(
        "--bar",
        type=float,
        help=f"the ratio a point must stay within (default {TUNED_BAR}; {GENERIC_BAR} under MAGI2_PROFILE=generic)",
    )
    ap.add_argument("--no-plans", action="store_true", help="time providers only, not the plan candidates")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    bar = args.bar or (GENERIC_BAR if os.environ.get("MAGI2_PROFILE", "").strip() == "generic" else TUNED_BAR)
    points = load_shapes(args.shapes) if args.shapes else default_grid()
    points = select_ops(points, args.ops.split(",") if args.ops else None)  # type: ignore[arg-type]
    result = run(points, device=args.device, reps=args.reps, warmup=args.warmup, bar=bar, plans=not args.no_plans)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    s = result["summary"]
    print(
        f"profile {result['profile']['name']} ({result['profile']['source']}): {s['points'] - len(s['failed'])} of "
        f"{s['points']} points within {bar}x; worst choice {s['worst_ratio']:.3f}x (resolved call "
        f"{s['worst_call_ratio']:.3f}x, not judged); failed: {s['failed'] or 'none'}; "
        f"fell to the reference: {s['fell_to_reference'] or 'none'}; {result['seconds']} s"
    )
    return 1 if s["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
