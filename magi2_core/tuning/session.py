"""A resumable tuning run: finished points are kept in ``<out>.partial`` and skipped when run again.

After every point the results so far are written (atomically) next to the profile's path; a run
that stops (an error, Ctrl-C, a lost machine) and is started again with the same ``--out`` measures
only the points missing there. A partial file from another device, or one that cannot be read, is
set aside with a note and the run starts afresh; ``--fresh`` ignores it. The file is removed once
the profile is written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from magi2_core.profiles.active import DeviceKey
from magi2_core.tuning.measure import PointResult

__all__ = ["FORMAT", "Session", "partial_path"]

FORMAT = "magi2-tune-partial"


def partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _device(device: DeviceKey) -> dict[str, str | None]:
    return {"type": device.type, "name": device.name, "capability": device.capability}


class Session:
    """The finished points of a run towards ``out`` on ``device``."""

    def __init__(self, out: Path, device: DeviceKey, *, fresh: bool = False) -> None:
        self.path = partial_path(out)
        self.device = device
        self.done: dict[str, PointResult] = {}
        self.note = ""
        if not fresh and self.path.exists():
            self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, not {FORMAT!r}")
            if data.get("device") != _device(self.device):
                self.note = (
                    f"{self.path} was measured on {data.get('device')}, not on this {self.device}: starting afresh"
                )
                return
            results = [PointResult.model_validate(p) for p in data["points"]]
        except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
            self.note = f"{self.path} cannot be resumed ({type(exc).__name__}: {exc}): starting afresh"
            return
        self.done = {r.id: r for r in results}
        self.note = f"resuming from {self.path}: {len(self.done)} points already measured"

    def pending(self, ids: Sequence[str]) -> list[str]:
        """The ids not measured yet, in order."""
        return [i for i in ids if i not in self.done]

    def record(self, result: PointResult) -> None:
        """Keep ``result`` and write every finished point so far."""
        self.done[result.id] = result
        data = {
            "format": FORMAT,
            "device": _device(self.device),
            "points": [r.model_dump(mode="json") for r in self.done.values()],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(self.path)

    def finish(self) -> None:
        """The profile is written: the partial file is no longer needed."""
        self.path.unlink(missing_ok=True)
