"""``magi2 check``: run the conformance kit against installed providers; non-zero exit on any failure."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from magi2_core.cli._output import console, err_console, print_json
from magi2_core.testing.cases import DEFAULT_MAX_TOKENS
from magi2_core.testing.runner import CaseResult, KitReport, plan, run_kit


def _table(report: KitReport) -> Table:
    table = Table(title=f"magi2 conformance (seed {report.seed})", title_justify="left")
    for col in ("op", "provider", "device", "passed", "failed", "ineligible", "time", "note"):
        table.add_column(col, overflow="fold")
    for row in report.summary():
        failed = row["failed"]
        table.add_row(row["op"], row["provider"], row["device"], str(row["passed"]),
                      f"[red]{failed}[/red]" if failed else "0", str(row["ineligible"]), f"{row['seconds']:.2f}s",
                      f"skipped: {row['skipped']}" if "skipped" in row else ("FAIL" if failed else "ok"))
    return table


def check(
    provider: Annotated[list[str] | None, typer.Option("--provider", "-p",
                                                      help="provider to check (repeatable; default: all installed)")] = None,
    op: Annotated[list[str] | None, typer.Option("--op", help="only these operators (repeatable)")] = None,
    device: Annotated[list[str] | None, typer.Option("--device", help="only these device types (repeatable)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed of the generated inputs")] = 0,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="longest boundary layout generated")] = DEFAULT_MAX_TOKENS,
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Run the conformance kit: generated cases per provider, compared with the reference provider."""
    try:
        kit = plan(provider, ops=op, devices=device, seed=seed, max_tokens=max_tokens)  # type: ignore[arg-type]
    except ValueError as exc:
        err_console.print(f"[red]magi2 check:[/red] {exc}")
        raise typer.Exit(2) from exc
    if json_out:
        report = run_kit(kit_plan=kit)
        print_json(report.as_dict())
    else:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True) as progress:
            task = progress.add_task("checking", total=len(kit.cases))

            def advance(result: CaseResult, done: int, total: int) -> None:
                progress.update(task, completed=done, description=f"{result.case.op}[{result.case.provider}]")
                if result.status == "failed":
                    progress.console.print(f"[red]FAILED[/red] {result.case.id}")

            report = run_kit(kit_plan=kit, on_result=advance)
        for failure in report.failed:
            console.rule(f"[red]{failure.case.id}")
            console.print(failure.report, markup=False, highlight=False)
        console.print(_table(report))
        console.print(report.format().rsplit("\n\n", 1)[-1], markup=False, highlight=False)
    if not report.ok:
        raise typer.Exit(1)
