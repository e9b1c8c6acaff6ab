"""``magi2 backends``: installed backends, providers, capabilities, quarantined plugins."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from magi2_core import config
from magi2_core.cli._output import console, print_json
from magi2_core.registry import get_registry

_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def backends(json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """List installed backends and their providers; quarantined plugins are listed with the reason."""
    reg = get_registry()
    loaded = reg.backends()
    quarantined = reg.quarantined()
    if json_out:
        print_json(
            {
                "backends": [
                    {"entry_point": b.entry_point, "load_seconds": round(b.load_seconds, 4),
                     **b.spec.model_dump(mode="json")}
                    for b in loaded
                ],
                "quarantined": [q.model_dump(mode="json") for q in quarantined],
                "config": {k: sorted(v) if isinstance(v, frozenset) else v for k, v in config.effective().items()},
            }
        )
        return
    for b in loaded:
        table = Table(
            title=f"{b.spec.name} {b.spec.version} (entry point {b.entry_point!r}, core {b.spec.core_api}, "
            f"loaded in {b.load_seconds:.2f} s)",
            title_justify="left",
        )
        for col in ("op", "provider", "prio", "devices", "dtypes", "features", "rules"):
            table.add_column(col, overflow="fold")
        for c in sorted(b.spec.providers, key=lambda c: (c.op, -c.priority, c.name)):
            table.add_row(
                c.op,
                c.name,
                str(c.priority),
                ",".join(c.device_types),
                ",".join(_SHORT.get(d, d) for d in c.dtypes),
                ",".join(sorted(f.value for f in c.features)) or "-",
                "\n".join(f"{r.id}: {r.describe()}" for r in c.rules) or "-",
            )
        console.print(table)
    if quarantined:
        q = Table(title="quarantined plugins (not loaded; everything else works)")
        for col in ("entry point", "distribution", "reason"):
            q.add_column(col)
        for item in quarantined:
            q.add_row(item.entry_point, item.distribution, item.reason)
        console.print(q)
