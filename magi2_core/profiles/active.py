"""Which device profile is active for a device, read once per process and cached.

In this order: ``MAGI2_PROFILE`` (a file, ``generic`` or a shipped profile's name) for devices of
its type; else a user profile (written by ``magi2 tune``) in :func:`user_profile_dir` for this
device (name and capability), one measured with the installed kernel library versions first; else
the shipped fragments for this device, the core's first (``magi2_core/profiles/*.json``), then each
backend's in backend-name order, rows concatenated; else the *generic* profile of the device type
and capability: the generic fragments (no device name) that backends ship, and otherwise no rows, so
the descriptors' priorities decide.

Files are parsed once; the device's name and capability are read once per device
(:func:`magi2_core.model.devices.device_identity`); the selection is cached per device and per set of
backend fragments. :func:`magi2_core.reload_config` drops every cache.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Literal

from magi2_core import config
from magi2_core.errors import ConfigError, ProfileError
from magi2_core.model.capability import Provenance
from magi2_core.model.problem import OpName, Problem
from magi2_core.profiles.model import (
    FORMAT,
    VERSION,
    PlanRow,
    Preference,
    Profile,
    ProfileDevice,
    load_profile,
    loads_profile,
)
from magi2_core.reasons import PreferenceNote, ProfileNote

__all__ = [
    "GENERIC",
    "DeviceKey",
    "Fragment",
    "LoadedProfile",
    "Source",
    "active_profile",
    "backend_fragments",
    "boundaries",
    "fragment_from_resource",
    "generic_fragments",
    "installed_version",
    "names_device",
    "profile_for",
    "profile_of",
    "reset_profiles",
    "shipped_profiles",
    "use_backend_fragments",
    "user_profile_dir",
    "user_profiles",
]

GENERIC = "generic"
Source = Literal["env", "given", "user", "shipped", "generic"]
log = logging.getLogger("magi2_core")


@dataclass(frozen=True)
class DeviceKey:
    """A device as profiles see it: its type, and its name and capability where torch reports them."""

    type: str
    name: str | None = None
    capability: str | None = None

    def __str__(self) -> str:
        if self.name is None:
            return f"{self.type} (no device name known here)"
        return f"{self.type} {self.name}" + (f" (capability {self.capability})" if self.capability else "")


@dataclass(frozen=True)
class Fragment:
    """A profile file as read: the profile, where it came from, the backend that ships it ("" = core), and
    ``file``: for a fragment a package ships (the core's or a backend's), its file as ``package/path``
    (empty for a user profile or ``MAGI2_PROFILE``'s file)."""

    profile: Profile
    origin: str
    backend: str = ""
    file: str = ""

    @property
    def packaged(self) -> bool:
        """Shipped in a package (the core's or a backend's), not a file of the user's."""
        return bool(self.file)


@dataclass(frozen=True)
class LoadedProfile:
    """The profile active for one device: every row of the fragments merged, each with its provenance."""

    profile: Profile
    source: Source
    origins: tuple[str, ...]
    device: DeviceKey
    note: ProfileNote = field(repr=False)
    fragments: tuple[Fragment, ...] = field(default=(), repr=False)  # merged, in order

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def generic(self) -> bool:
        return self.source == "generic"

    def preference_for(self, problem: Problem) -> Preference | None:
        return self.profile.preference_for(problem)

    def plans_for(self, op: OpName, provider: str, problem: Problem | None = None) -> tuple[PlanRow, ...]:
        return self.profile.plans_for(op, provider, problem)

    def plan_for(self, op: OpName, provider: str, problem: Problem) -> PlanRow | None:
        return self.profile.plan_for(op, provider, problem)

    def own_plans(self) -> tuple[PlanRow, ...]:
        """The plan rows of its fragments that no package ships (a tuned or given file's), in order, each
        with its provenance (or its fragment's): what comes before the packaged rows (:func:`plan_rows`)."""
        return tuple(
            r if r.provenance else r.model_copy(update={"provenance": f.profile.provenance})
            for f in self.fragments
            if not f.packaged
            for r in f.profile.plans
        )

    def preference_note(self, row: Preference) -> PreferenceNote:
        index = self.profile.preferences.index(row)
        return PreferenceNote(
            id=row.id or f"preferences[{index}]",
            when=row.describe(),
            prefer=row.prefer,
            why=row.why,
            provenance=str(row.provenance or self.profile.provenance),
        )


def user_profile_dir() -> Path:
    """Where ``magi2 tune`` writes profiles: ``${XDG_CACHE_HOME:-~/.cache}/magi2/profiles``."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(base) if base else Path.home() / ".cache") / "magi2" / "profiles"


_lock = threading.Lock()
_shipped: tuple[Fragment, ...] | None = None
_user: tuple[Fragment, ...] | None = None
_files: dict[str, Profile] = {}
_active: dict[tuple[Any, ...], LoadedProfile] = {}
_bounds: dict[tuple[Any, ...], dict[str, tuple[int, ...]]] = {}
# Where active_profile() finds the backends' fragments by default: set by the process registry
# (magi2_core.selection.registry hands over its own, so that this module never imports the registry).
_backend_fragments: Callable[[], Sequence[Fragment]] | None = None


def backend_fragments() -> Sequence[Fragment]:
    """The backends' fragments that :func:`active_profile` merges by default (see :func:`use_backend_fragments`)."""
    return () if _backend_fragments is None else _backend_fragments()


def use_backend_fragments(source: Callable[[], Sequence[Fragment]] | None) -> None:
    """Make ``source()`` the backends' fragments that :func:`active_profile` merges by default (the process
    registry calls this when it is imported; ``None``: no backend fragments)."""
    global _backend_fragments
    _backend_fragments = source


def reset_profiles() -> None:
    """Forget every profile read and every selection (called by :func:`magi2_core.reload_config`, which is
    what tests and users call after changing ``MAGI2_PROFILE``, ``XDG_CACHE_HOME`` or a profile file)."""
    global _shipped, _user
    with _lock:
        _shipped = _user = None
        _files.clear()
        _active.clear()
        _bounds.clear()


config.on_reload(reset_profiles)


def shipped_profiles() -> tuple[Fragment, ...]:
    """The core's own profiles (package data ``magi2_core/profiles/*.json``), by file name."""
    global _shipped
    if _shipped is None:
        root = resources.files("magi2_core.profiles")
        found = sorted((p for p in root.iterdir() if p.name.endswith(".json")), key=lambda p: p.name)
        _shipped = tuple(
            Fragment(
                loads_profile(p.read_text(encoding="utf-8"), f"magi2_core/profiles/{p.name}"),
                f"magi2_core/profiles/{p.name}",
                file=f"magi2_core/profiles/{p.name}",
            )
            for p in found
        )
    return _shipped


def user_profiles() -> tuple[Fragment, ...]:
    """The profiles in :func:`user_profile_dir`, by file name; an invalid one is logged and skipped."""
    global _user
    if _user is None:
        out = []
        folder = user_profile_dir()
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            try:
                out.append(Fragment(load_profile(path), str(path)))
            except ProfileError as exc:
                log.warning(
                    "magi2_core: ignoring the user profile: %s (run `magi2 tune` again, or delete the file)", exc
                )
        _user = tuple(out)
    return _user


def fragment_from_resource(backend: str, resource: str) -> Fragment:
    """A backend's fragment named as ``'package:path/in/package.json'`` (package data)."""
    package, sep, path = resource.partition(":")
    if not sep or not package or not path.endswith(".json"):
        raise ProfileError(resource, "a backend's profile is named 'package:path/to/file.json' (package data)")
    try:
        text = resources.files(package).joinpath(path).read_text(encoding="utf-8")
    except (ModuleNotFoundError, OSError) as exc:
        raise ProfileError(resource, f"cannot read it: {type(exc).__name__}: {exc}") from None
    return Fragment(loads_profile(text, resource), f"{backend} ({resource})", backend, f"{package}/{path}")


def _file(path: str) -> Profile:
    if path not in _files:
        _files[path] = load_profile(path)
    return _files[path]


def names_device(frag: Fragment, device: ProfileDevice | DeviceKey) -> bool:
    """``frag`` is measured on ``device``: same type and name, and same capability where it names one."""
    d = frag.profile.device
    return (
        d.name is not None
        and d.type == device.type
        and d.name == device.name
        and (d.capability is None or d.capability == device.capability)
    )


def _generic_for(frag: Fragment, device: DeviceKey) -> bool:
    d = frag.profile.device
    return d.name is None and d.type == device.type and d.covers(device.capability)


@cache
def installed_version(distribution: str) -> str | None:
    """``major.minor`` of an installed distribution (``None``: not installed)."""
    try:
        version = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
    return _major_minor(version)


def _major_minor(version: str) -> str:
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 else version


def _library_notes(profile: Profile) -> tuple[str, ...]:
    out = []
    for lib, measured in profile.libraries.items():
        have = installed_version(lib)
        if have != _major_minor(measured):
            out.append(f"measured with {lib} {measured}, installed: {have or 'not installed'}")
    return tuple(out)


def _merge(
    frags: Sequence[Fragment], source: Source, device: DeviceKey, why: str, base: Profile | None = None
) -> LoadedProfile:
    """One profile from ``frags`` in order (``base``: its name, device and provenance), each row keeping
    its own provenance (or its fragment's); ``why``: why the device gets it."""
    head = base or frags[0].profile
    prefs: list[Preference] = []
    plans: list[PlanRow] = []
    libraries: dict[str, str] = {}
    for frag in frags:
        own = frag.profile.provenance
        prefs += [r if r.provenance else r.model_copy(update={"provenance": own}) for r in frag.profile.preferences]
        plans += [r if r.provenance else r.model_copy(update={"provenance": own}) for r in frag.profile.plans]
        for lib, version in frag.profile.libraries.items():
            libraries.setdefault(lib, version)
    merged = head.model_copy(update={"preferences": tuple(prefs), "plans": tuple(plans), "libraries": libraries})
    origins = tuple(f.origin for f in frags) or ("derived from the device type and capability",)
    note = ProfileNote(
        name=merged.name,
        source=source,
        origin=" + ".join(origins),
        device=str(device),
        device_type=device.type,
        provenance=str(merged.provenance),
        libraries=_library_notes(merged),
        why=why,
    )
    return LoadedProfile(merged, source, origins, device, note, tuple(frags))


def _generic(device: DeviceKey, backends: Sequence[Fragment], why: str) -> LoadedProfile:
    """The generic profile of the device's type and capability; ``why``: what led to it (the profile's
    name and what it covers are appended)."""
    name = "-".join([GENERIC, device.type] + ([device.capability] if device.capability else []))
    covers = f"{device.type} capability {device.capability}" if device.capability else f"any {device.type} device"
    why = f"{why} -> {name} (the generic profile of {covers})"
    base = Profile(
        format=FORMAT,
        version=VERSION,
        name=name,
        device=ProfileDevice(type=device.type, capability=device.capability),
        provenance=Provenance(
            kind="policy",
            source="magi2_core.profiles",
            note="derived from the device type and capability; no measurements of this device",
        ),
    )
    return _merge(generic_fragments(device, backends), "generic", device, why, base)


def generic_fragments(device: DeviceKey, backends: Sequence[Fragment]) -> list[Fragment]:
    """The backends' generic fragments for ``device``, in backend order: of each backend, those that name
    the device's capability class ("9" for a 9.x device) where it ships some, else those for any
    device of the type (a class fragment refines its backend's type-wide one; it does not add to it)."""
    covering = [f for f in backends if _generic_for(f, device)]
    by_class = {f.backend for f in covering if f.profile.device.capability is not None}
    return [f for f in covering if f.profile.device.capability is not None or f.backend not in by_class]


def _shipped_named(name: str, backends: Sequence[Fragment]) -> list[Fragment]:
    every = [*shipped_profiles(), *backends]
    named = next((f for f in every if f.profile.name == name), None)
    if named is None:
        known = sorted({f.profile.name for f in every} | {GENERIC})
        raise ConfigError(
            "MAGI2_PROFILE",
            name,
            config.VARIABLES["MAGI2_PROFILE"].accepted,
            f"no shipped profile has that name; shipped: {', '.join(known)}",
        )
    if named.profile.device.name is None:  # a generic fragment: itself alone
        return [named]
    return [f for f in every if names_device(f, named.profile.device)]


def _select(device: DeviceKey, backends: Sequence[Fragment], given: str | None = None) -> LoadedProfile:
    """The profile ``device`` gets, with why (:class:`ProfileNote`'s ``why``). ``given``: a profile named as
    ``MAGI2_PROFILE`` names one, used in its place (explain's ``--profile``)."""
    forced: str | None = given if given is not None else config.get("MAGI2_PROFILE")
    by = "--profile" if given is not None else "MAGI2_PROFILE"
    who = _who(device)
    if forced == GENERIC:
        return _generic(device, backends, f"{by}=generic")
    passed = ""
    if forced is not None:
        if config.looks_like_path(forced):
            frags = [Fragment(_file(forced), forced)]
        else:
            frags = _shipped_named(forced, backends)
        kind = frags[0].profile.device.type
        if kind == device.type:
            return _merge(frags, "given" if given is not None else "env", device, f"{by} names {forced}")
        passed = f"{by} names a {kind} profile, not one for {device.type}; "
    if device.name is not None:
        mine = [f for f in user_profiles() if names_device(f, device)]
        if mine:
            current = [f for f in mine if not _library_notes(f.profile)]
            why = "measured with the installed libraries" if current else "none measured with the installed libraries"
            return _merge(
                [(current or mine)[0]],
                "user",
                device,
                f"{passed}{who}: a user profile (magi2 tune) names this device and capability ({why})",
            )
        shipped = [f for f in (*shipped_profiles(), *backends) if names_device(f, device)]
        if shipped:
            return _merge(
                shipped, "shipped", device, f"{passed}{who}: a shipped profile names this device and capability"
            )
        return _generic(
            device, backends, f"{passed}{who}: no user or shipped profile for this device name and capability"
        )
    return _generic(device, backends, f"{passed}{who}")


def _who(device: DeviceKey) -> str:
    if device.name is None:
        return f"no {device.type} device name known here"
    return device.name + (f" (capability {device.capability})" if device.capability else "")


def _device(device: Any) -> tuple[str, int | None]:
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        return kind, int(index) if index else None
    return str(device.type), device.index


def active_profile(device: Any = "cpu", backends: Sequence[Fragment] | None = None) -> LoadedProfile:
    """The profile active for ``device`` (a ``torch.device``, or ``"cuda"``, ``"cuda:1"``, ...).

    ``backends``: the backends' fragments (default: those of the process registry's backends, handed
    over by :func:`use_backend_fragments`).
    """
    if backends is None:
        backends = backend_fragments()
    kind, index = _device(device)
    return profile_for(kind, index, backends)


def profile_for(device_type: str, device_index: int | None, backends: Sequence[Fragment]) -> LoadedProfile:
    """:func:`active_profile` for a device given as type and index, with the backends' fragments."""
    from magi2_core.model.devices import device_identity

    kind, index = device_type, device_index
    key = (tuple(f.origin for f in backends), kind, index)
    found = _active.get(key)
    if found is None:
        name, capability = device_identity(kind, index)
        found = _select(DeviceKey(kind, name, capability), backends)
        with _lock:
            _active[key] = found
    return found


def profile_of(
    device: DeviceKey, backends: Sequence[Fragment] | None = None, *, profile: str | None = None
) -> LoadedProfile:
    """The profile active for a device given by its key (type, name, capability), without asking torch:
    what a provider that keys its own data by device (the Triton MoE plan) reads, and what explain reads
    for a described device. ``backends``: as in :func:`active_profile`; ``profile``: a profile named as
    ``MAGI2_PROFILE`` names one, used in its place (None: ``MAGI2_PROFILE`` applies)."""
    if backends is None:
        backends = backend_fragments()
    key = ("key", tuple(f.origin for f in backends), device, profile)
    found = _active.get(key)
    if found is None:
        found = _select(device, backends, profile)
        with _lock:
            _active[key] = found
    return found


def boundaries(op: OpName, backends: Sequence[Fragment]) -> dict[str, tuple[int, ...]]:
    """Every integer boundary of ``op``'s rows in any profile that may become active (the shipped ones,
    ``backends``, the user's and ``MAGI2_PROFILE``'s): the resolution cache buckets by them too."""
    key = (op, tuple(f.origin for f in backends))
    found = _bounds.get(key)
    if found is None:
        profiles: list[Profile] = [f.profile for f in (*shipped_profiles(), *backends, *user_profiles())]
        forced = config.get("MAGI2_PROFILE")
        if forced is not None and config.looks_like_path(forced):
            profiles.append(_file(forced))
        found = _union(p.boundaries().get(op, {}) for p in profiles)
        with _lock:
            _bounds[key] = found
    return found


def _union(parts: Iterable[dict[str, set[int]]]) -> dict[str, tuple[int, ...]]:
    out: dict[str, set[int]] = {}
    for part in parts:
        for fld, values in part.items():
            out.setdefault(fld, set()).update(values)
    return {f: tuple(sorted(v)) for f, v in out.items()}
