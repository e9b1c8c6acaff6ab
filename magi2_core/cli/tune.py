"""``magi2 tune``: measure every eligible provider and plan on this machine, write a device profile.

``magi2 tune --show`` prints the profile active for the device instead. Described in docs/tuning.md.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from magi2_core.cli._output import console, print_json, say, usage_error

if TYPE_CHECKING:
    from magi2_core.profiles import LoadedProfile
    from magi2_core.tuning import TuneRun
    from magi2_core.tuning.grid import Shape


def tune(
    ops: Annotated[
        str | None,
        typer.Option(help="only these ops, comma-separated: attention, moe_experts, moe_route, rmsnorm (default: all)"),
    ] = None,
    shapes: Annotated[
        Path | None, typer.Option(help="a JSON file of points to measure instead of the default grid (docs/tuning.md)")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="where to write the profile (default: the user profile folder, where it is active for this device)"
        ),
    ] = None,
    show: Annotated[bool, typer.Option("--show", help="print the active profile for --device and exit")] = False,
    reps: Annotated[int, typer.Option(help="timed calls per provider and plan at each point")] = 10,
    warmup: Annotated[int, typer.Option(help="untimed calls first (compilation, caches)")] = 2,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume/--fresh", help="skip the points a stopped run already measured (<out>.partial), or start over"
        ),
    ] = True,
    device: Annotated[
        str,
        typer.Option(
            help="the device to measure: cuda (or cuda:N, musa); cpu runs the machinery on the host, for testing"
        ),
    ] = "cuda",
    note: Annotated[str, typer.Option(help="added to the profile's provenance note (a commit, the machine)")] = "",
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Measure every eligible provider (and the MoE plan's kernels, tiles and alignments) over a grid of
    production shapes on this machine, and write a device profile that prefers the fastest."""
    from magi2_core.model.problem import OPS

    def reject(message: str) -> NoReturn:
        usage_error("tune", message, json_out=json_out)

    if show:
        _show(device, json_out)
        return
    if reps < 1 or warmup < 0:
        reject(f"--reps must be at least 1 and --warmup at least 0; got {reps} and {warmup}")
    chosen = None
    if ops is not None:
        chosen = [o.strip() for o in ops.split(",") if o.strip()]
        unknown = [o for o in chosen if o not in OPS]
        if unknown or not chosen:
            reject(f"--ops {ops!r}: expected a comma-separated list of {', '.join(OPS)}")
    _check_device(device, reject)
    from magi2_core.tuning.grid import default_grid, load_shapes, select_ops

    points = select_ops(load_shapes(shapes) if shapes is not None else default_grid(), chosen)  # type: ignore[arg-type]
    if not points:
        reject(f"no point of {'--shapes ' + str(shapes) if shapes else 'the default grid'} is of --ops {ops}")
    run = _measure(
        points, device=device, reps=reps, warmup=warmup, out=out, fresh=not resume, json_out=json_out, note=note
    )
    if json_out:
        print_json(
            {
                "profile": str(run.path),
                "name": run.profile.name,
                "points": len(run.results),
                "measured": run.measured,
                "resumed": run.resumed,
                "seconds": round(run.seconds, 1),
                "preferences": len(run.profile.preferences),
                "plans": len(run.profile.plans),
                "note": run.note,
                "errors": {r.id: r.errors for r in run.results if r.errors},
            }
        )
        return
    from magi2_core.profiles import user_profile_dir

    where = run.path.resolve()
    active_here = where.parent == user_profile_dir().resolve()
    lines = [
        f"wrote profile {run.profile.name} to {where}",
        f"  {len(run.results)} points ({run.measured} measured now, {run.resumed} resumed) in {run.seconds:.0f} s; "
        f"{len(run.profile.preferences)} preference rows, {len(run.profile.plans)} plan rows",
        f"  it is the active profile for this device from now on (user profiles are read from {user_profile_dir()})"
        if active_here
        else f"  to use it: MAGI2_PROFILE={where} (or copy it to {user_profile_dir()})",
        "  `magi2 tune --show` prints it; `magi2 explain OP ...` shows which row decides a call",
    ]
    failed = [(r.id, name, err) for r in run.results for name, err in r.errors.items()]
    if failed:
        lines.append(f"  {len(failed)} providers or plans raised on their first call and were not timed:")
        lines += [f"    {pid}: {name}: {err}" for pid, name, err in failed[:20]]
    say("\n".join(lines))


def _check_device(device: str, reject: Callable[[str], NoReturn]) -> None:
    import torch

    from magi2_core.model.devices import cuda_available, musa_available

    kind = device.split(":")[0]
    if kind == "cpu":
        return
    if kind == "cuda" and not cuda_available():
        reject(
            f"--device {device}: magi2 tune measures kernels on this machine's GPU, and torch {torch.__version__} "
            f"sees no CUDA device here (--device cpu runs the machinery on the host, for testing)"
        )
    if kind not in ("cuda", "musa"):
        reject(f"--device {device}: expected cuda, cuda:N, musa or cpu")
    if kind == "musa" and not musa_available():  # imports torch_musa (torch.musa exists only after that)
        reject(
            f"--device {device}: no usable MUSA device here (torch_musa and a MUSA device are needed; "
            f"--device cpu runs the machinery on the host, for testing)"
        )


def _measure(
    points: list[Shape],
    *,
    device: str,
    reps: int,
    warmup: int,
    out: Path | None,
    fresh: bool,
    json_out: bool,
    note: str,
) -> TuneRun:
    from rich import progress as rp

    from magi2_core.tools import timing
    from magi2_core.tuning import tune as run_tune

    command = " ".join(["magi2", *sys.argv[1:]]) if "tune" in sys.argv[1:] else "magi2 tune"
    columns = (
        rp.TextColumn("{task.description}"),
        rp.BarColumn(),
        rp.MofNCompleteColumn(),
        rp.TimeElapsedColumn(),
        rp.TimeRemainingColumn(),
    )
    lines = not console.is_terminal and not json_out  # a log: one line per point instead of a live bar
    started = time.perf_counter()
    with rp.Progress(*columns, console=console, transient=False, disable=json_out or lines) as bar:
        task = bar.add_task("tuning", total=len(points))

        def progress(done: int, total: int, current: str) -> None:
            bar.update(task, completed=done, description=current[:60] or "done")
            if lines:
                what = f"measuring {current}" if current else "done"
                print(f"[{done}/{total}] {time.perf_counter() - started:6.1f} s  {what}", flush=True)

        return run_tune(
            points,
            device=device,
            reps=reps,
            warmup=warmup,
            out=out,
            fresh=fresh,
            timer=timing.default_timer(device),
            command=command,
            progress=progress,
            note=note,
        )


def _show(device: str, json_out: bool) -> None:
    import magi2_core.selection.registry  # noqa: F401  (hands the backends' profile fragments to the profiles)
    from magi2_core.profiles import active_profile, every_plan_rows

    loaded = active_profile(device)
    if json_out:
        plans = [
            {
                "op": op,
                "provider": provider,
                "source": rows.source,
                "rows": [r.model_dump(mode="json", exclude_none=True) for r in rows.rows],
            }
            for op, provider, rows in every_plan_rows(loaded.device)
        ]
        print_json(
            {
                "source": loaded.source,
                "origins": list(loaded.origins),
                "device": str(loaded.device),
                "profile": loaded.profile.model_dump(mode="json", exclude_none=True),
                "plans": plans,
            }
        )
        return
    say(_describe(loaded))


def _describe(loaded: LoadedProfile) -> str:
    from magi2_core.profiles import every_plan_rows
    from magi2_core.reasons import tune_advice

    p = loaded.profile
    lines = [
        f"active profile for {loaded.device}: {p.name} ({loaded.source}; {' + '.join(loaded.origins)})",
        f"  provenance: {p.provenance}",
    ]
    if p.libraries:
        lines.append("  libraries: " + ", ".join(f"{k} {v}" for k, v in p.libraries.items()))
    if loaded.note.libraries:
        lines += [f"  note: {n}" for n in loaded.note.libraries]
    if loaded.generic:
        lines.append(
            "  no measurements of this device: priority decides where no row matches; "
            + tune_advice(loaded.device.type)
        )
    lines.append(f"preferences ({len(p.preferences)}):" if p.preferences else "preferences: none")
    for i, row in enumerate(p.preferences):
        lines.append(
            f"  {row.id or f'preferences[{i}]'}: {row.op} where {row.describe()} -> prefer {', '.join(row.prefer)}"
        )
        lines.append(f"      why: {row.why}")
    found = every_plan_rows(loaded.device)
    lines.append(
        f"plans ({sum(len(rows.rows) for _, _, rows in found)}), as each provider reads them:"
        if found
        else "plans: none for this device"
    )
    for op, provider, rows in found:
        lines.append(f"  {op} on {provider}: {rows.source}")
        for i, plan in enumerate(rows.rows, 1):
            when = " and ".join(str(c) for c in plan.when) or "every call"
            body = ", ".join(f"{k}={v}" for k, v in plan.plan.items())
            lines.append(f"    row {i}{f' ({plan.id})' if plan.id else ''} where {when} -> {body}")
            lines.append(f"        why: {plan.why}")
    return "\n".join(lines)
