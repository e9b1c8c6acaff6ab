"""``magi2 overhead`` (also ``magi2 bench``, its earlier name): cached-resolution and dispatch overhead per op
call on this machine."""

from __future__ import annotations

from typing import Annotated

import typer

from magi2_core.cli._output import print_json, say, terminal_width, usage_error
from magi2_core.cli._table import WIDE_HELP, Column, render


def overhead(
    iters: Annotated[int, typer.Option(help="calls per measurement")] = 20000,
    device: Annotated[str, typer.Option(help="where every input lives: cpu, or cuda (the serving path)")] = "cpu",
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    wide: Annotated[bool, typer.Option("--wide", help=WIDE_HELP)] = False,
) -> None:
    """Measure cached resolution and dispatch overhead per op call (kernel benchmarks: benchmarks/*.py)."""
    if iters < 1:
        usage_error("overhead", f"--iters must be at least 1; got {iters}", json_out=json_out)
    import torch

    from magi2_core.tools.overhead import DEVICES, dispatch_overhead

    if device not in DEVICES:
        usage_error("overhead", f"--device must be one of {', '.join(DEVICES)}; got {device!r}", json_out=json_out)
    if device == "cuda" and not torch.cuda.is_available():
        why = f"--device cuda needs a CUDA device; torch {torch.__version__} sees none here (run --device cpu)"
        usage_error("overhead", why, json_out=json_out)
    rows = dispatch_overhead(iters=iters, device=device)
    if json_out:
        print_json(rows)
        return
    columns = (
        Column("op"),
        Column("resolve (cached) us"),
        Column("public call us"),
        Column("direct provider us"),
        Column("added us"),
        Column("added, inference_mode us"),
    )
    cells = [
        [
            r["op"],
            *(f"{r[k]:.2f}" for k in ("resolve_us", "public_us", "direct_us", "added_us", "added_inference_us")),
        ]
        for r in rows
    ]
    say(
        render(
            f"dispatch overhead per call against a no-op provider (inputs on {device}, best of 5 repeats)",
            columns,
            cells,
            width=terminal_width(),
            wide=wide,
        )
    )
