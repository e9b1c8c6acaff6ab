"""``magi2 env``: versions, devices, kernel builds, and which providers can run here and why not."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from magi2_core.cli._output import print_json, say, terminal_width
from magi2_core.cli._table import WIDE_HELP, Column, render


def _or_none(value: Any) -> str:
    return "-" if value in (None, "", [], {}) else str(value)


def env(
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    wide: Annotated[bool, typer.Option("--wide", help=WIDE_HELP)] = False,
) -> None:
    """Report versions (core, backends, torch, Triton, CUDA, driver, GPU, MUSA, FA3/FA4/MATE builds) and which
    providers are usable here, and why not."""
    from magi2_core.tools.report import environment_report

    report = environment_report()
    if json_out:
        print_json(report)
        return
    t = report["torch"]
    gpus = "; ".join(f"{g['index']}: {g['name']} (cc {g['capability']}, {g['memory_gib']} GiB)" for g in t["gpus"])
    lines = [
        f"magi2-core        {report['magi2_core']['version']} (core contract {report['magi2_core']['core_api']})",
        f"python            {report['python']} on {report['platform']}",
        f"torch             {t['version']} (CUDA build {_or_none(t['cuda_build'])}, HIP {_or_none(t['hip_build'])}, "
        f"MUSA {_or_none(t['musa_build'])})",
        f"CUDA available    {t['cuda_available']}; driver {_or_none(t['driver'])}; GPUs {_or_none(gpus)}",
        f"triton            {_or_none(report['triton'])}",
        f"MUSA              torch_musa {_or_none(report['musa']['torch_musa'])}, torchada "
        f"{_or_none(report['musa']['torchada'])}, device available {report['musa']['available']}",
    ]
    for kind, found in report["kernel_builds"].items():
        lines.append(f"{kind + ' builds':<18}{_or_none(', '.join(f'{d} {v}' for d, v in found.items()))}")
    lines.append(f"device types      {', '.join(report['device_types_present'])}")
    width = terminal_width()
    say("\n".join(lines) + "\n")
    rows = [[b["entry_point"], b["distribution"], b["version"], b["core_api"]] for b in report["backends"]]
    rows += [[q["entry_point"], q["distribution"], "-", f"quarantined: {q['reason']}"] for q in report["quarantined"]]
    columns = (
        Column("entry point"),
        Column("distribution"),
        Column("version", droppable=True),
        Column("core contract"),
    )
    say(render("backends", columns, rows, width=width, wide=wide) + "\n")
    rows = [
        [
            p["op"],
            p["provider"],
            p["backend"],
            f"yes ({', '.join(p['usable_on'])})" if p["usable"] else f"no: {p['why_not']}",
        ]
        for p in report["providers"]
    ]
    columns = (Column("op"), Column("provider"), Column("backend", droppable=True), Column("usable here", floor=20))
    say(render("providers (usable here = can run on a device of this machine)", columns, rows, width=width, wide=wide))
    if report["overrides"]:
        say("\nMAGI2_* variables set here:")
        for o in report["overrides"]:
            state = "ok" if o["valid"] else f"INVALID: {o['why']}"
            say(f"  {o['variable']}={o['value']}: {state}")
