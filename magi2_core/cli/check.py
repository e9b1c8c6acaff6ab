"""``magi2 check``: run the conformance kit against installed providers; non-zero exit on any failure.

On a terminal a progress bar; piped (CI logs, ``nox -s conformance``) one line as each provider's cases
finish, so that a long run is never silent.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from typing import TYPE_CHECKING, Annotated

import typer

from magi2_core.cli._output import console, print_json, say, terminal_width, usage_error
from magi2_core.cli._table import WIDE_HELP, Column, render

if TYPE_CHECKING:
    from collections.abc import Callable

    from magi2_core.testing.runner import AnyCase, CaseResult, KitReport

_COLUMNS = (
    Column("op"),
    Column("provider"),
    Column("device"),
    Column("passed"),
    Column("failed"),
    Column("ineligible", droppable=True),
    Column("time", droppable=True),
    Column("note", floor=30),
)


def _table(report: KitReport, *, wide: bool) -> str:
    rows = [
        [
            row["op"],
            row["provider"],
            row["device"],
            str(row["passed"]),
            str(row["failed"]),
            str(row["ineligible"]),
            f"{row['seconds']:.2f}s",
            f"skipped: {row['skipped']}" if "skipped" in row else ("FAIL" if row["failed"] else "ok"),
        ]
        for row in report.summary()
    ]
    return render(f"magi2 conformance (seed {report.seed})", _COLUMNS, rows, width=terminal_width(), wide=wide)


def check(
    provider: Annotated[
        list[str] | None,
        typer.Option("--provider", "-p", help="provider to check (repeatable; default: all installed)"),
    ] = None,
    op: Annotated[list[str] | None, typer.Option("--op", help="only these operators (repeatable)")] = None,
    device: Annotated[list[str] | None, typer.Option("--device", help="only these device types (repeatable)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="seed of the generated inputs")] = 0,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", help="longest boundary layout generated [default: 256]")
    ] = None,
    keyword: Annotated[
        list[str] | None,
        typer.Option(
            "-k",
            help="only cases whose id contains this text, ignoring case (repeatable); a failure prints the "
            "command that reruns it alone",
        ),
    ] = None,
    list_cases: Annotated[
        bool,
        typer.Option("--list", help="print the ids of the cases that would run (after -k), one a line, and run none"),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    wide: Annotated[bool, typer.Option("--wide", help=WIDE_HELP)] = False,
) -> None:
    """Run the conformance kit: generated cases per provider, compared with the reference provider."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from magi2_core.model.problem import OPS
    from magi2_core.testing.op_cases import DEFAULT_MAX_TOKENS
    from magi2_core.testing.runner import plan, run_kit
    from magi2_core.tools.report import present_device_types

    unknown_ops = [o for o in op or () if o not in OPS]
    if unknown_ops:
        usage_error("check", f"unknown --op {', '.join(unknown_ops)}; choose from {', '.join(OPS)}", json_out=json_out)
    present = present_device_types()
    absent = [d for d in device or () if d not in present]
    if absent:
        usage_error(
            "check",
            f"--device {', '.join(absent)}: no usable device of that type here (present: "
            f"{', '.join(present)}); see 'magi2 env'",
            json_out=json_out,
        )
    if max_tokens is not None and max_tokens < 1:
        usage_error("check", f"--max-tokens must be at least 1; got {max_tokens}", json_out=json_out)
    try:
        kit = plan(
            provider,
            ops=op,  # type: ignore[arg-type]
            devices=device,
            seed=seed,
            max_tokens=DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        )
    except ValueError as exc:
        usage_error("check", str(exc), json_out=json_out)
    if not kit.cases:
        why = "; ".join(f"{s.op}[{s.provider}]: {s.reason}" for s in kit.skipped) or "no provider selected"
        usage_error("check", f"nothing to check here: {why}", json_out=json_out)
    if keyword:
        wanted = [k.lower() for k in keyword]
        kit = dataclasses.replace(kit, cases=[c for c in kit.cases if any(k in c.id.lower() for k in wanted)])
        if not kit.cases:
            usage_error(
                "check",
                f"no case id contains {' or '.join(map(repr, keyword))} (a failing case prints its id)",
                json_out=json_out,
            )
    if list_cases:
        if json_out:
            print_json([c.id for c in kit.cases])
        else:
            print("\n".join(c.id for c in kit.cases))
        return
    if json_out:
        report = run_kit(kit_plan=kit)
        print_json(report.as_dict())
    elif not console.is_terminal:  # piped: a live progress bar would print nothing until the end
        report = run_kit(kit_plan=kit, on_result=_line_per_provider(kit.cases))
    else:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("checking", total=len(kit.cases))

            def advance(result: CaseResult, done: int, total: int) -> None:
                progress.update(task, completed=done, description=f"{result.case.op}[{result.case.provider}]")
                if result.status == "failed":
                    progress.console.print(f"[red]FAILED[/red] {result.case.id}")

            report = run_kit(kit_plan=kit, on_result=advance)
    if not json_out:
        for failure in report.failed:
            if console.is_terminal:
                console.rule(f"[red]{failure.case.id}")
            else:
                say(f"--- FAILED {failure.case.id}")
            say(failure.report)
        say(_table(report, wide=wide))
        say(report.format().rsplit("\n\n", 1)[-1])
    if not report.ok:
        raise typer.Exit(1)


def _line_per_provider(cases: list[AnyCase]) -> Callable[[CaseResult, int, int], None]:
    """A progress callback that prints one line when all the cases of an (op, provider, device) are done."""
    planned = Counter((c.op, c.provider, c.device) for c in cases)
    seen: dict[tuple[str, str, str], Counter[str]] = {}
    start = time.monotonic()

    def advance(result: CaseResult, done: int, total: int) -> None:
        c = result.case
        group = (c.op, c.provider, c.device)
        counts = seen.setdefault(group, Counter())
        counts[result.status] += 1
        if result.status == "failed":
            say(f"FAILED {c.id}")
        if counts.total() == planned[group]:
            say(
                f"{c.op}[{c.provider}] on {c.device}: {counts['passed']} passed, {counts['failed']} failed, "
                f"{counts['ineligible']} ineligible ({done}/{total} cases, {time.monotonic() - start:.0f} s)"
            )

    return advance
