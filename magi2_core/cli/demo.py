"""``magi2 demo``: one MAGI-2 layer on the best device, with provider, error and time per op call."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Annotated

import typer

from magi2_core.cli._output import console, err_console, print_json, say, terminal_width, usage_error
from magi2_core.cli._table import WIDE_HELP, Column, render


def demo(
    device: Annotated[str | None, typer.Option(help="cpu, cuda, musa (default: the best present)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the random weights and inputs")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    wide: Annotated[bool, typer.Option("--wide", help=WIDE_HELP)] = False,
) -> None:
    """Run one toy-width MAGI-2 layer (every op) and report each call against a float64 oracle."""
    import torch

    from magi2_core.tools.demo import best_device, run_demo
    from magi2_core.tools.report import present_device_types

    if device is None:
        dev = best_device()
    else:
        present = present_device_types()
        kind = device.split(":", 1)[0]
        if kind not in present:
            usage_error(
                "demo",
                f"--device {device}: no usable {kind} device here (present: {', '.join(present)}); see 'magi2 env'",
                json_out=json_out,
            )
        try:
            dev = torch.device(device)
        except RuntimeError:
            usage_error("demo", f"--device {device!r} is not a torch device, such as cpu or cuda:0", json_out=json_out)
    status = console.status(f"running one MAGI-2 layer on {dev}...") if not json_out else nullcontext()
    # On a terminal the progress prints above the spinner (through its console); piped, on stderr.
    progress = console if console.is_terminal else err_console
    with status:
        reports = run_demo(
            dev,
            seed=seed,
            progress=None if json_out else lambda s: progress.print(f"  done {s}", markup=False, highlight=False),
        )
    if json_out:
        print_json([r.as_dict() for r in reports])
        return
    columns = (
        Column("op"),
        Column("branch"),
        Column("provider"),
        Column("dtype"),
        Column("max |err|"),
        Column("rel-L2 err"),
        Column("median ms"),
    )
    rows = [
        [r.op, r.branch, r.provider, r.dtype, f"{r.max_abs_err:.3g}", f"{r.rel_l2_err:.3g}", f"{r.median_ms:.2f}"]
        for r in reports
    ]
    say(render(f"magi2 demo on {dev} (errors vs a float64 oracle)", columns, rows, width=terminal_width(), wide=wide))
