"""Write a shipped device profile from a profile that ``magi2 tune`` wrote, split as shipped profiles are.

The core's fragment (``magi2_core/profiles/<name>.json``) takes the tune's preference rows; the Triton
backend's (``magi2_backend_triton/profiles/<name>.json``) takes its MoE plan rows, then the generic
Hopper rows (``generic-cuda-sm90.json``, written by ``scripts/generic_hopper_rows.py``) for every call
outside the measured classes, since a device's named fragment replaces the generic one. Rows keep the
tune's conditions and numbers; ids gain the profile's prefix, and each row's ``why`` names the device
it was measured on (a tune writes "measured here"). Provenance: the committed tune file, its date and
commit, and ``magi2 tune``.

    python scripts/ship_tuned_profile.py          # rewrite the H100's two fragments
    python scripts/ship_tuned_profile.py --check  # exit 1 if either committed fragment is stale
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "magi2_core" / "profiles"
TRITON = ROOT / "backends" / "triton" / "src" / "magi2_backend_triton" / "profiles"
HERE = "measured here by `magi2 tune`"


@dataclass(frozen=True)
class Shipped:
    """A tune to ship: its file, the shipped name and id prefix, the commit it ran and what checked it."""

    tune: str
    name: str
    prefix: str
    commit: str
    check: str


H100 = Shipped(
    tune="benchmarks/results/tuning/profile_tuned_h100_e6abbd8.json",
    name="nvidia-h100",
    prefix="h100-",
    commit="e6abbd8",
    check="benchmarks/results/profile_check_tuned_h100.json",
)


def _why(row: dict[str, Any], device: str) -> str:
    why = str(row["why"])
    if HERE not in why:
        raise ValueError(f"row {row.get('id')!r}: a tune's why says {HERE!r}; got {why!r}")
    return why.replace(HERE, f"measured by `magi2 tune` on an {device}")


def _provenance(ship: Shipped, tune: dict[str, Any], note: str) -> dict[str, str]:
    return {
        "kind": "tune",
        "source": ship.tune,
        "date": tune["provenance"]["date"],
        "tool": "magi2 tune --fresh",
        "note": note,
    }


def fragments(ship: Shipped) -> dict[Path, str]:
    """The two files of ``ship`` and their text."""
    tune = json.loads((ROOT / ship.tune).read_text())
    device = tune["device"]["name"]
    measured = (
        f"a fresh `magi2 tune` over the default grid on one {device} at commit {ship.commit} "
        f"({tune['provenance']['note'].split(';')[0]}); checked by benchmarks/profile_check.py: {ship.check}"
    )
    prefs = [{**r, "id": ship.prefix + r["id"], "why": _why(r, device)} for r in tune["preferences"]]
    core = {
        "format": "magi2-profile",
        "version": 1,
        "name": ship.name,
        "device": tune["device"],
        "libraries": tune["libraries"],
        "provenance": _provenance(
            ship,
            tune,
            f"the preference rows of {measured}; the MoE plan rows are the Triton backend's {ship.name} fragment",
        ),
        "preferences": prefs,
    }
    generic = json.loads((TRITON / "generic-cuda-sm90.json").read_text())
    row_provenance = {k: v for k, v in _provenance(ship, tune, "").items() if v}
    plans = [
        {k: v for k, v in r.items() if k != "id"} | {"why": _why(r, device), "provenance": row_provenance}
        for r in tune["plans"]
        if r["op"] == "moe_experts" and r["provider"] == "triton"
    ]
    triton = {
        "format": "magi2-profile",
        "version": 1,
        "name": ship.name,
        "device": tune["device"],
        "libraries": {k: v for k, v in tune["libraries"].items() if k in ("torch", "triton")},
        "provenance": _provenance(
            ship,
            tune,
            f"the MoE plan rows of {measured}; rows {len(plans) + 1}-"
            f"{len(plans) + len(generic['plans'])}: generic-cuda-sm90's, for "
            f"the calls outside the measured classes",
        ),
        "preferences": [],
        "plans": plans + generic["plans"],
    }
    return {
        CORE / f"{ship.name}.json": json.dumps(core, indent=2) + "\n",
        TRITON / f"{ship.name}.json": json.dumps(triton, indent=1) + "\n",
    }


def main(argv: list[str]) -> int:
    stale = []
    for path, text in fragments(H100).items():
        if "--check" not in argv:
            path.write_text(text)
        elif not path.is_file() or path.read_text() != text:
            stale.append(str(path.relative_to(ROOT)))
    if stale:
        print(f"stale: {', '.join(stale)}: run python scripts/ship_tuned_profile.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
