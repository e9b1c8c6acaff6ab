"""``magi2 demo``: a small MAGI-2 block on the best device, with provider, error and time per op."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Annotated

import typer

from magi2_core.cli._output import console, err_console, print_json, usage_error


def demo(
    device: Annotated[str | None, typer.Option(help="cpu, cuda, musa (default: the best present)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the random weights and inputs")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Run rmsnorm -> attention (one sink) -> routed MoE and report each op against a float64 oracle."""
    import torch
    from rich.table import Table

    from magi2_core.demo import best_device, run_demo
    from magi2_core.report import present_device_types

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
    status = console.status(f"running the MAGI-2 demo block on {dev}...") if not json_out else nullcontext()
    with status:
        reports = run_demo(dev, seed=seed, progress=None if json_out else lambda s: err_console.print(f"  done {s}"))
    if json_out:
        print_json([r.as_dict() for r in reports])
        return
    table = Table(title=f"magi2 demo on {dev} (errors vs a float64 oracle)")
    for col in ("op", "provider", "dtype", "max |err|", "rel-L2 err", "median ms"):
        table.add_column(col)
    for r in reports:
        table.add_row(r.op, r.provider, r.dtype, f"{r.max_abs_err:.3g}", f"{r.rel_l2_err:.3g}", f"{r.median_ms:.2f}")
    console.print(table)
