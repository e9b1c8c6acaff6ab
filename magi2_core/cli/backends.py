"""``magi2 backends``: installed backends, providers, capabilities, quarantined plugins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from magi2_core import config
from magi2_core.cli._output import console, print_json

if TYPE_CHECKING:
    from magi2_core.registry import LoadedBackend
    from magi2_core.report import ProviderStatus

_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def _backend_json(b: LoadedBackend, status: dict[tuple[str, str], ProviderStatus]) -> dict[str, Any]:
    """The spec as before, each provider with ``usable_here``, ``usable_on`` and ``why_not`` added."""
    data: dict[str, Any] = {
        "entry_point": b.entry_point,
        "load_seconds": round(b.load_seconds, 4),
        **b.spec.model_dump(mode="json"),
    }
    for entry, cap in zip(data["providers"], b.spec.providers, strict=True):
        s = status[(cap.op, cap.name)]
        entry.update(usable_here=s.usable, usable_on=list(s.usable_on), why_not=s.why_not)
    return data


def _sink_corrections(device_types: list[str]) -> dict[str, dict[str, str]]:
    """The learned-sink correction each device type gets: present ones and those a correction declares.

    For a device type this host lacks, what would be tried, in order, without importing a kernel for it
    (describing stays cheap: the Triton correction imports Triton)."""
    from magi2_core.errors import ConfigError
    from magi2_core.registry import get_registry
    from magi2_core.sink_correction.choice import TORCH, sink_correction_for

    state = get_registry().state()
    corrections = state.sink_corrections  # priority descending
    declared = {d for c in corrections for d in c.device_types}
    out: dict[str, dict[str, str]] = {}
    for device_type in sorted(set(device_types) | declared):
        if device_type not in device_types:
            var = state.forced_by.get(device_type)
            forced = config.get(var) if var is not None else None
            order = [forced] if forced else [*(c.name for c in corrections if device_type in c.device_types), TORCH]
            how = f"forced by {var}" if forced else "the first that imports of " + ", ".join(order)
            out[device_type] = {"name": order[0], "detail": f"{how} (not imported: no {device_type} device here)"}
            continue
        try:
            chosen = sink_correction_for(device_type)
            out[device_type] = {"name": chosen.name, "detail": chosen.detail}
        except ConfigError as exc:
            out[device_type] = {"name": "(none)", "detail": str(exc)}
    return out


def backends(json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False) -> None:
    """List installed backends, their providers and whether each can run here; quarantined plugins with the reason."""
    from rich.table import Table

    from magi2_core.registry import get_registry
    from magi2_core.report import present_device_types, provider_status

    reg = get_registry()
    loaded = reg.backends()
    quarantined = reg.quarantined()
    present = present_device_types()
    status: dict[tuple[str, str], ProviderStatus] = {(c.op, c.name): provider_status(c.model_copy(update={"backend": b.spec.name}), present, reg)
              for b in loaded for c in b.spec.providers}
    if json_out:
        print_json(
            {
                "backends": [_backend_json(b, status) for b in loaded],
                "quarantined": [q.model_dump(mode="json") for q in quarantined],
                "device_types_present": list(present),
                "sink_corrections": _sink_corrections(list(present)),
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
        for col in ("op", "provider", "prio", "devices", "dtypes", "features", "rules", "usable here"):
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
                status[(c.op, c.name)].summary(),
            )
        console.print(table)
    for device_type, chosen in _sink_corrections(list(present)).items():
        console.print(f"sink correction on {device_type}: {chosen['name']}: {chosen['detail']}", markup=False)
    if quarantined:
        q = Table(title="quarantined plugins (not loaded; everything else works)")
        for col in ("entry point", "distribution", "reason"):
            q.add_column(col)
        for item in quarantined:
            q.add_row(item.entry_point, item.distribution, item.reason)
        console.print(q)
