"""``magi2 env``: versions, devices, kernel builds, and which providers can run here and why not."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from magi2_core.cli._output import console, print_json


def _or_none(value: Any) -> str:
    return "-" if value in (None, "", [], {}) else str(value)


def env(json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """Report versions (core, backends, torch, Triton, CUDA, driver, GPU, MUSA, FA3/FA4/MATE builds) and which providers are usable here, and why not."""
    from rich.table import Table

    from magi2_core.report import environment_report

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
    console.print("\n".join(lines), markup=False, highlight=False)
    backends = Table(title="backends", title_justify="left")
    for col in ("entry point", "distribution", "version", "core contract"):
        backends.add_column(col)
    for b in report["backends"]:
        backends.add_row(b["entry_point"], b["distribution"], b["version"], b["core_api"])
    for q in report["quarantined"]:
        backends.add_row(q["entry_point"], q["distribution"], "-", f"quarantined: {q['reason']}")
    console.print(backends)
    providers = Table(title="providers (usable here = can run on a device of this machine)", title_justify="left")
    for col in ("op", "provider", "backend", "usable here"):
        providers.add_column(col, overflow="fold")
    for p in report["providers"]:
        usable = f"yes ({', '.join(p['usable_on'])})" if p["usable"] else f"no: {p['why_not']}"
        providers.add_row(p["op"], p["provider"], p["backend"], usable)
    console.print(providers)
    if report["overrides"]:
        console.print("MAGI2_* variables set here:", markup=False)
        for o in report["overrides"]:
            state = "ok" if o["valid"] else f"INVALID: {o['why']}"
            console.print(f"  {o['variable']}={o['value']}: {state}", markup=False, highlight=False)
