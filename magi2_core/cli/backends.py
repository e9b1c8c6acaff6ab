"""``magi2 backends``: installed backends, providers, capabilities, quarantined plugins."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from magi2_core import config
from magi2_core.cli._output import print_json, say, terminal_width
from magi2_core.cli._table import WIDE_HELP, Column, render

if TYPE_CHECKING:
    from magi2_core.selection.registry import LoadedBackend
    from magi2_core.tools.report import ProviderStatus

_SHORT = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
# Narrowest last: on a narrow terminal the rules go first, then the features (--wide keeps them).
_COLUMNS = (
    Column("op"),
    Column("provider"),
    Column("prio"),
    Column("devices"),
    Column("dtypes"),
    Column("features", droppable=True),
    Column("rules", droppable=True),
    Column("usable here"),
)


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
    from magi2_core.selection.registry import get_registry
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


def backends(
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    wide: Annotated[bool, typer.Option("--wide", help=WIDE_HELP)] = False,
) -> None:
    """List installed backends, their providers and whether each can run here; quarantined plugins with the reason."""
    from magi2_core.model.problem import OP_FEATURES
    from magi2_core.selection.registry import get_registry
    from magi2_core.tools.report import present_device_types, provider_status

    reg = get_registry()
    loaded = reg.backends()
    quarantined = reg.quarantined()
    present = present_device_types()
    status: dict[tuple[str, str], ProviderStatus] = {
        (c.op, c.name): provider_status(c.model_copy(update={"backend": b.spec.name}), present, reg)
        for b in loaded
        for c in b.spec.providers
    }
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
    width = terminal_width()
    for b in loaded:
        title = (
            f"{b.spec.name} {b.spec.version} (entry point {b.entry_point!r}, core {b.spec.core_api}, "
            f"loaded in {b.load_seconds:.2f} s)"
        )
        rows = [
            [
                c.op,
                c.name,
                str(c.priority),
                ",".join(c.device_types),
                ",".join(_SHORT.get(d, d) for d in c.dtypes),
                # only the features a call of this op can ask for: a descriptor may declare more
                ",".join(sorted(f.value for f in c.features & OP_FEATURES[c.op])) or "-",
                "\n".join(f"{r.id}: {r.describe()}" for r in c.rules) or "-",
                status[(c.op, c.name)].summary(),
            ]
            for c in sorted(b.spec.providers, key=lambda c: (c.op, -c.priority, c.name))
        ]
        say(render(title, _COLUMNS, rows, width=width, wide=wide) + "\n")
    for device_type, chosen in _sink_corrections(list(present)).items():
        say(f"sink correction on {device_type}: {chosen['name']}: {chosen['detail']}")
    if quarantined:
        rows = [[q.entry_point, q.distribution, q.reason] for q in quarantined]
        say(
            "\n"
            + render(
                "quarantined plugins (not loaded; everything else works)",
                (Column("entry point"), Column("distribution"), Column("reason")),
                rows,
                width=width,
                wide=wide,
            )
        )
