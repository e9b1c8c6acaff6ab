"""The profile ``magi2 tune`` writes: the measured rows first, then the previous active profile's.

The file is a plain profile (``docs/profiles.md``) named ``tuned-<device>``, for this device's name
and capability, with provenance (``kind: tune``, the date, the command, the magi2-core version and
commit, the harness settings) and the kernel library versions installed. After the rows measured in
this run come the rows of the profile that was active before (shipped or an earlier tune; an earlier
tune's rows for the ops measured again are dropped), so calls outside the measured classes keep the
choice they had. Plan rows that packages ship are not copied: a provider reads them after the profile's
own (:func:`magi2_core.profiles.plan_rows`).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from magi2_core._version import __version__
from magi2_core.model.capability import Provenance
from magi2_core.model.problem import OpName
from magi2_core.profiles.active import DeviceKey, LoadedProfile, installed_version, user_profile_dir
from magi2_core.profiles.model import FORMAT, VERSION, PlanRow, Preference, Profile, ProfileDevice, loads_profile
from magi2_core.tuning.measure import PointResult
from magi2_core.tuning.regions import plan_rows, preference_rows

__all__ = ["LIBRARIES", "build_profile", "checkout_commit", "default_path", "profile_name", "write_profile"]

LIBRARIES = ("torch", "triton", "fa3-fwd", "flash-attn-4")  # recorded when installed, with the previous profile's


def profile_name(device: DeviceKey) -> str:
    """``tuned-<device name>`` in lower case, dashes for anything else (``tuned-nvidia-h200``)."""
    slug = re.sub(r"[^a-z0-9.]+", "-", (device.name or device.type).lower()).strip("-.")
    return f"tuned-{slug or device.type}"


def default_path(device: DeviceKey) -> Path:
    """Where the profile goes unless ``--out`` says otherwise: :func:`user_profile_dir`, where it is active."""
    return user_profile_dir() / f"{profile_name(device)}.json"


R = TypeVar("R", Preference, PlanRow)


def _kept(rows: Sequence[R], ops: Sequence[OpName]) -> list[R]:
    return [r for r in rows if not (r.provenance is not None and r.provenance.kind == "tune" and r.op in ops)]


def checkout_commit() -> str | None:
    """The commit of the git checkout magi2-core runs from, when its tracked files are that commit's
    (``None``: not a checkout, no git here, or modified files: the commit would not name what ran)."""
    here = os.path.dirname(os.path.abspath(__file__))

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", here, *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        if git("status", "--porcelain", "--untracked-files=no"):
            return None
        return git("rev-parse", "--short", "HEAD") or None
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None


def build_profile(
    results: Sequence[PointResult],
    ops: Sequence[OpName],
    device: DeviceKey,
    base: LoadedProfile | None,
    *,
    command: str,
    reps: int,
    warmup: int,
    note: str = "",
) -> Profile:
    """The profile of this run: rows from ``results`` for ``ops``, then ``base``'s rows (module docstring)."""
    prefs: list[Preference] = preference_rows(results, ops)
    plans: list[PlanRow] = []
    for provider in sorted({r.provider for p in results for r in p.plans}):
        plans += plan_rows(results, provider)
    libraries = {
        lib: v
        for lib in dict.fromkeys([*LIBRARIES, *(base.profile.libraries if base else ())])
        if (v := installed_version(lib)) is not None
    }
    commit = checkout_commit()
    before = (
        f"; the rows after the measured ones are {base.name}'s ({base.source}), for calls outside the measured classes"
        if base is not None and (base.profile.preferences or base.own_plans())
        else ""
    )
    provenance = Provenance(
        kind="tune",
        source=f"magi2 tune on {device}",
        date=datetime.date.today().isoformat(),
        tool=command,
        note=f"{len(results)} points, {reps} timed calls each after {warmup} warm-up calls, alternating, the L2 "
        f"flushed before each, the median per call (device events on a GPU); magi2-core {__version__}"
        + (f" at {commit}" if commit else "")
        + before
        + (f"; {note}" if note else ""),
    )
    if base is not None:
        prefs += [r for r in _kept(base.profile.preferences, ops) if r not in prefs]
        plans += [r for r in _kept(base.own_plans(), ops) if r not in plans]
    return Profile(
        format=FORMAT,
        version=VERSION,
        name=profile_name(device),
        device=ProfileDevice(type=device.type, name=device.name, capability=device.capability),
        libraries=libraries,
        provenance=provenance,
        preferences=tuple(prefs),
        plans=tuple(plans),
    )


def write_profile(profile: Profile, path: str | Path) -> Path:
    """Write ``profile`` as JSON to ``path`` (atomically; folders made), after checking it reads back."""
    path = Path(path)
    text = json.dumps(profile.model_dump(mode="json", exclude_none=True, exclude_defaults=False), indent=1) + "\n"
    loads_profile(text, str(path))  # a profile that would not load is a bug here, not a file to leave behind
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
