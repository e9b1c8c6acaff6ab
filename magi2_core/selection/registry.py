"""Backend discovery: entry points, spec validation, quarantine, allow/deny lists.

Backends are found under the entry-point group ``magi2_core.backends``; each entry point names a
function that returns the backend's whole :class:`~magi2_core.model.backend_spec.BackendSpec` (or the module
that defines it as ``magi2_backend``). Each one is loaded and called in isolation: an entry point that
fails to import, is no such function, has a pluggy-era hook beside it (told what to change), raises,
returns an invalid spec, declares an incompatible core contract range, redeclares a provider name, a
sink-correction name or a ``MAGI2_*`` variable (:class:`~magi2_core.model.backend_spec.Setting`) that the core
or another backend declares, or forces the sink correction of a device type that another backend's
setting already forces, is *quarantined* with its reason (shown by ``magi2 backends`` and in every
``explain()``) and never breaks the others; so is one whose device-profile fragments
(``BackendSpec.profiles``) cannot be read or are not valid. A loaded backend's settings are declared
in :mod:`magi2_core.config` under its name, and withdrawn when it is unregistered or the registry
reloads.
The exact reference is bound by distribution and entry point, not by name: the ``reference`` entry
point of ``magi2-backend-reference`` (the core's own dependency) loads first, and any other backend
that uses the entry-point name ``reference`` or declares a provider named ``reference`` is quarantined
(a name collision always quarantines the newcomer). Readers see the registry through one immutable
:class:`RegistryState` that every change rebuilds aside and swaps in as one reference, with a new
``generation``. A backend that takes over :data:`SLOW_LOAD_S` seconds to load is logged as a warning
that says how to drop it. An entry point is imported in a helper thread and waited for at most
``MAGI2_PLUGIN_IMPORT_TIMEOUT`` seconds: one that hangs is quarantined with that reason instead of
blocking the first op call for as long as it hangs (its import goes on in the background).

Every ``MAGI2_*`` variable of the core is parsed before the first backend loads, and every variable
the backends declared once they have all loaded: a bad value is a :class:`ConfigError` for the caller
(the CLI prints it in one line; the registry stays unloaded), never a backend quarantined because its
import happened to read the variable first.

``MAGI2_PLUGINS`` (comma-separated entry-point names) is an allow-list, ``MAGI2_DISABLE_PLUGINS`` a
deny-list (both read through :mod:`magi2_core.config`); neither can remove the ``reference`` backend, and
an allow-list naming an entry point that is not installed is a :class:`ConfigError`. Loading is lazy
(first use) and thread-safe.
"""

from __future__ import annotations

import importlib
import logging
import re
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from magi2_core import config
from magi2_core._version import CHANGED_SINCE, CORE_API_VERSION
from magi2_core.model.backend_spec import BackendSpec, SinkCorrectionSpec
from magi2_core.model.capability import Capability, descriptor_errors
from magi2_core.model.problem import INT_FIELDS, OPS, OpName
from magi2_core.profiles.active import Fragment, fragment_from_resource, use_backend_fragments
from magi2_core.reasons import QuarantinedPlugin

__all__ = [
    "ENTRY_POINT_GROUP",
    "REFERENCE",
    "REFERENCE_DIST",
    "LoadedBackend",
    "LoadedProvider",
    "Registry",
    "RegistryState",
    "TORCH_SINK_CORRECTION",
    "get_registry",
]

ENTRY_POINT_GROUP = "magi2_core.backends"
REFERENCE = "reference"  # entry point and provider name of the exact reference
REFERENCE_DIST = "magi2-backend-reference"  # the core's own dependency: always loaded, loaded first
TORCH_SINK_CORRECTION = "torch"  # the core's own sink correction's name: no backend may contribute one by it
SLOW_LOAD_S = 1.0  # a backend slower than this to import and describe itself is logged as a WARNING
log = logging.getLogger("magi2_core")


@dataclass
class LoadedProvider:
    """A provider's descriptor plus its lazily imported kernel object."""

    capability: Capability
    _impl: Any = None
    _error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.capability.name

    def load(self) -> tuple[Any, str | None]:
        """Import ``impl`` once; return ``(object, None)`` or ``(None, why it failed)``."""
        if self._impl is None and self._error is None:
            with self._lock:
                if self._impl is None and self._error is None:
                    module_name, _, attr = self.capability.impl.partition(":")
                    try:
                        obj: Any = importlib.import_module(module_name)
                        for part in attr.split("."):
                            obj = getattr(obj, part)
                        self._impl = obj
                    except Exception as exc:  # an optional dependency missing, a broken build...
                        self._error = f"cannot import {self.capability.impl}: {type(exc).__name__}: {exc}"
        return self._impl, self._error


@dataclass(frozen=True)
class LoadedBackend:
    entry_point: str
    spec: BackendSpec
    plugin: object
    distribution: str = "(registered in process)"
    load_seconds: float = 0.0
    sink_corrections: tuple[SinkCorrectionSpec, ...] = ()
    profiles: tuple[Fragment, ...] = ()  # the device-profile fragments it ships, validated


@dataclass(frozen=True)
class RegistryState:
    """One consistent, immutable view of the registry; replaced as a whole on every change."""

    generation: int
    providers: Mapping[OpName, tuple[LoadedProvider, ...]]
    bounds: Mapping[OpName, Mapping[str, tuple[int, ...]]]
    quarantined: tuple[QuarantinedPlugin, ...]
    sink_corrections: tuple[SinkCorrectionSpec, ...] = ()  # contributed ones, priority descending
    profiles: tuple[Fragment, ...] = ()  # the backends' profile fragments, in backend-name order
    # Device type -> the variable (a backend's Setting) that forces its sink correction by name.
    forced_by: Mapping[str, str] = field(default_factory=dict)

    def provider(self, op: OpName, name: str) -> LoadedProvider | None:
        return next((p for p in self.providers[op] if p.name == name), None)


_EMPTY = RegistryState(0, {op: () for op in OPS}, {op: {} for op in OPS}, ())


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


class Registry:
    """The installed backends and their providers, per operator, in resolution order."""

    def __init__(self, *, discover: bool = True) -> None:
        self._discover = discover
        self._lock = threading.RLock()
        self._loaded = False
        self._backends: dict[str, LoadedBackend] = {}
        self._quarantined: list[QuarantinedPlugin] = []
        # Working lists, touched only under the lock; readers use the swapped-in ``_state``.
        self._providers: dict[OpName, list[LoadedProvider]] = {op: [] for op in OPS}
        self._state = _EMPTY
        self._loading = False
        self._plugin_lists: tuple[object, ...] | None = None  # the backend-load variables it loaded with
        # The process registry fixes its backend-load variables (config.fix): a later change is refused.
        self._fixes_config = False
        # Threads importing an entry point for this registry: a plugin that asks for the registry while
        # it is imported sees the state so far (the loading thread holds the lock while it waits).
        self._importers: set[int] = set()

    # -- loading -------------------------------------------------------------------------------
    def _ensure_loaded(self) -> None:
        if self._loaded or threading.get_ident() in self._importers:
            return
        with self._lock:
            # Another thread loaded meanwhile, or a plugin being imported asked for the registry (the
            # lock is re-entrant): it sees the state so far instead of starting a second discovery.
            if self._loaded or self._loading:
                return
            self._loading = True
            try:
                if self._discover:
                    self._load_entry_points()
                self._loaded = True
                self._changed()
            except BaseException:  # a bad MAGI2_* value: nothing stays half-loaded, the next call retries
                self._clear()
                raise
            finally:
                self._loading = False

    def _load_entry_points(self) -> None:
        config.effective()  # parse every MAGI2_* variable first: a bad one is the caller's ConfigError
        allow: frozenset[str] | None = config.get("MAGI2_PLUGINS")
        deny: frozenset[str] = config.get("MAGI2_DISABLE_PLUGINS") or frozenset()
        # The genuine reference first, so that no other backend can take its names; then by name.
        eps = sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: (not _is_reference(ep), ep.name))
        installed = {ep.name for ep in eps}
        for name in sorted(deny - installed):
            log.warning("magi2_core: MAGI2_DISABLE_PLUGINS names %r, which is not an installed backend", name)
        for ep in eps:
            if ep.name != REFERENCE and ((allow is not None and ep.name not in allow) or ep.name in deny):
                log.info("magi2_core: backend entry point %r skipped by MAGI2_PLUGINS/MAGI2_DISABLE_PLUGINS", ep.name)
                continue
            dist = ep.dist.name if ep.dist is not None else "?"
            if ep.name == REFERENCE and not _is_reference(ep):
                self._quarantine(
                    ep.name,
                    ep.value,
                    dist,
                    f"the entry point name {REFERENCE!r} belongs to "
                    f"{REFERENCE_DIST}; rename this backend's entry point",
                )
                continue
            start = time.perf_counter()
            # The genuine reference is always loaded (it is the fallback of every op): never on a timer.
            plugin, failure = self._import(ep, None if _is_reference(ep) else config.get("MAGI2_PLUGIN_IMPORT_TIMEOUT"))
            if failure is not None:
                self._quarantine(ep.name, ep.value, dist, failure)
                continue
            self._add(plugin, ep.name, ep.value, dist, start, entry_point=True)
        config.effective()  # and the variables the backends declared: a bad one is the caller's ConfigError
        self._plugin_lists = self._load_settings()
        if self._fixes_config:
            for name in self._fixed_names():
                config.fix(name)

    def _load_settings(self) -> tuple[object, ...]:
        return tuple(config.get(name) for name in self._fixed_names())

    def _fixed_names(self) -> list[str]:
        """The variables read at backend load: the core's and the loaded backends' ``read='backend load'``."""
        own = [s.name for b in self._backends.values() for s in b.spec.settings if s.read == "backend load"]
        return [*_LOAD_VARIABLES, *own]

    def _import(self, ep: Any, limit: float | None) -> tuple[object, str | None]:
        """``ep.load()`` in a helper thread, waited for at most ``limit`` seconds (``None`` or 0: no limit).

        Returns ``(plugin, None)``, or ``(None, why)`` for an import that raised or did not finish. A
        thread cannot be stopped: a hung import goes on in the background (a daemon thread, which does
        not keep the process alive) and its eventual result is dropped.
        """
        outcome: dict[str, Any] = {}

        def run() -> None:
            self._importers.add(threading.get_ident())
            try:
                outcome["plugin"] = ep.load()
            except BaseException as exc:  # re-raised below as a direct import would have raised it
                outcome["error"] = exc

        worker = threading.Thread(target=run, name=f"magi2-import-{ep.name}", daemon=True)
        worker.start()
        worker.join(limit or None)
        if worker.is_alive():
            return None, (
                f"import did not finish within {limit:g} s (MAGI2_PLUGIN_IMPORT_TIMEOUT={limit:g}): "
                f"set a larger MAGI2_PLUGIN_IMPORT_TIMEOUT if this backend needs longer, or "
                f"MAGI2_DISABLE_PLUGINS={ep.name} to stop loading it"
            )
        self._importers.discard(worker.ident or 0)
        error = outcome.get("error")
        if isinstance(error, Exception):
            return None, f"import failed: {type(error).__name__}: {error}"
        if error is not None:  # SystemExit, KeyboardInterrupt: not the registry's to swallow
            raise error
        return outcome["plugin"], None

    def register(self, plugin: object, name: str) -> None:
        """Register a backend in process (tests, or a backend outside entry points).

        ``plugin`` is what an entry point names (a function returning the :class:`BackendSpec`), the
        spec itself, or a module or object whose ``magi2_backend`` attribute is such a function.
        """
        with self._lock:
            self._ensure_loaded()
            dist = REFERENCE_DIST if name == REFERENCE and _is_reference_module(plugin) else "(registered in process)"
            self._add(plugin, name, repr(plugin), dist, time.perf_counter())
            self._changed()
            if self._fixes_config:  # its backend-load settings are read now, as an entry point's are
                self._plugin_lists = self._load_settings()
                for fixed in self._fixed_names():
                    config.fix(fixed)

    def unregister(self, name: str) -> None:
        with self._lock:
            backend = self._backends.pop(name, None)
            self._quarantined = [q for q in self._quarantined if q.entry_point != name]
            if backend is not None:
                config.withdraw(backend.spec.name)
                for op in OPS:
                    self._providers[op] = [p for p in self._providers[op] if p.capability.backend != backend.spec.name]
            self._changed()

    def _add(
        self, plugin: object, name: str, value: str, dist: str, start: float, *, entry_point: bool = False
    ) -> None:
        if name in self._backends:
            self._quarantine(
                name,
                value,
                dist,
                f"a backend named {name!r} is already registered "
                f"({self._backends[name].spec.name}); unregister it first or choose another name",
            )
            return
        try:
            describe = _describer(plugin, value, entry_point=entry_point)
        except TypeError as exc:
            self._quarantine(name, value, dist, str(exc))
            return
        try:
            spec = describe()
            if not isinstance(spec, BackendSpec):
                spec = BackendSpec.model_validate(spec)
            _check_core_api(spec)
            reference = name == REFERENCE and _normalise(dist) == REFERENCE_DIST
            if not reference and any(c.name == REFERENCE for c in spec.providers):
                raise ValueError(
                    f"the provider name {REFERENCE!r} is reserved for {REFERENCE_DIST}'s exact "
                    f"reference; rename this backend's provider"
                )
            # A descriptor naming a field its op lacks is an authoring error that would never fire:
            # the whole backend is quarantined (as for any invalid spec), not just that capability dropped.
            wrong = [f"{c.op}:{c.name} {why}" for c in spec.providers for why in descriptor_errors(c)]
            if wrong:
                raise ValueError(
                    "capability descriptors name problem fields their op does not have: " + "; ".join(wrong)
                )
            clashes = [
                f"{c.op}:{c.name}" for c in spec.providers if any(p.name == c.name for p in self._providers[c.op])
            ]
            if clashes:
                raise ValueError(f"provider names already registered by another backend: {clashes}")
            corrections = self._sink_corrections(spec)
            self._check_settings(spec)
            # A broken fragment is this backend's failure (quarantined with the reason), never the others'.
            fragments = tuple(fragment_from_resource(spec.name, r) for r in spec.profiles)
            self._declare(spec)  # last: nothing after it can fail
        except Exception as exc:
            self._quarantine(name, value, dist, f"{type(exc).__name__}: {exc}")
            return
        seconds = time.perf_counter() - start
        if seconds > SLOW_LOAD_S:
            # Something to act on for a third-party backend (drop it); the reference cannot be dropped,
            # so a slow reference is a bug of this project, logged for a report rather than warned about.
            if name == REFERENCE:
                log.info("magi2_core: the reference backend took %.1f s to import and describe itself", seconds)
            else:
                log.warning(
                    "magi2_core: backend %r (%s) took %.1f s to import and describe itself, which every "
                    "process pays on its first op call; if you do not use it, set "
                    "MAGI2_DISABLE_PLUGINS=%s (or list the backends you use in MAGI2_PLUGINS)",
                    name,
                    dist,
                    seconds,
                    name,
                )
        self._backends[name] = LoadedBackend(name, spec, plugin, dist, seconds, corrections, fragments)
        for cap in spec.providers:
            cap = cap.model_copy(update={"backend": spec.name, "version": cap.version or spec.version})
            self._providers[cap.op].append(LoadedProvider(cap))

    def _sink_corrections(self, spec: BackendSpec) -> tuple[SinkCorrectionSpec, ...]:
        """The spec's sink corrections, stamped with the backend; a name already contributed is an error."""
        out = tuple(c.model_copy(update={"backend": spec.name}) for c in spec.sink_corrections)
        taken = {TORCH_SINK_CORRECTION} | {c.name for b in self._backends.values() for c in b.sink_corrections}
        clashes = sorted({c.name for c in out} & taken)
        if clashes:
            raise ValueError(f"sink correction names already taken (by the core or another backend): {clashes}")
        return out

    def _check_settings(self, spec: BackendSpec) -> None:
        """A variable declared by another owner, or a device type's sink correction already forced, is an
        error of the newcomer (this backend), naming both owners."""
        names = [s.name for s in spec.settings]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"settings declared more than once in the spec: {twice}")
        for setting in spec.settings:
            if setting.read == "plugin load":
                raise ValueError(
                    f"setting {setting.name} of {spec.name}: read='plugin load' is the vLLM plugin's "
                    "moment; a backend reads a setting at 'every call' or 'backend load'"
                )
            held_by = config.owner(setting.name)
            if held_by is not None and held_by != spec.name:
                raise ValueError(
                    f"setting {setting.name} is already declared by {held_by}; {spec.name} declares "
                    f"it too: rename {spec.name}'s setting"
                )
        forced = self._forced_by()
        for setting in spec.settings:
            device_type = setting.forces_sink_correction_on
            if device_type is not None and device_type in forced:
                var, owner = forced[device_type]
                raise ValueError(
                    f"setting {setting.name} of {spec.name} would force the sink correction on "
                    f"{device_type!r}, which {var} of {owner} already forces; drop one of them"
                )

    def _declare(self, spec: BackendSpec) -> None:
        declared: list[str] = []
        try:
            for setting in spec.settings:
                config.declare(setting, spec.name)
                declared.append(setting.name)
        except config.SettingConflict:
            if declared:
                config.withdraw(spec.name)
            raise

    def _forced_by(self) -> dict[str, tuple[str, str]]:
        """Device type -> (variable, owner) for every loaded backend's sink-correction-forcing setting."""
        return {
            s.forces_sink_correction_on: (s.name, b.spec.name)
            for b in self._backends.values()
            for s in b.spec.settings
            if s.forces_sink_correction_on is not None
        }

    def _quarantine(self, name: str, value: str, dist: str, reason: str) -> None:
        installed = not dist.startswith("(")  # not a plugin registered in process
        todo = f"; fix or uninstall {dist}" if installed else ""
        if installed and name != REFERENCE:  # the deny list cannot name the reference's entry point
            todo += f", or set MAGI2_DISABLE_PLUGINS={name} to skip it"
        log.warning("magi2_core: backend %r (%s) quarantined, everything else works: %s%s", name, dist, reason, todo)
        self._quarantined.append(QuarantinedPlugin(entry_point=name, value=value, distribution=dist, reason=reason))

    def _changed(self) -> None:
        """Build the new state aside and swap it in as one reference (readers never see it half-built)."""
        providers: dict[OpName, tuple[LoadedProvider, ...]] = {}
        all_bounds: dict[OpName, Mapping[str, tuple[int, ...]]] = {}
        for op in OPS:
            providers[op] = tuple(sorted(self._providers[op], key=lambda p: (-p.capability.priority, p.name)))
            bounds: dict[str, set[int]] = {}
            for p in providers[op]:
                for fld, values in p.capability.boundaries().items():
                    bounds.setdefault(fld, set()).update(values)
            all_bounds[op] = {f: tuple(sorted(v)) for f, v in bounds.items() if f in INT_FIELDS}
        corrections = sorted(
            (c for b in self._backends.values() for c in b.sink_corrections), key=lambda c: (-c.priority, c.name)
        )
        fragments = tuple(f for b in sorted(self._backends.values(), key=lambda b: b.spec.name) for f in b.profiles)
        forced = {device_type: var for device_type, (var, _) in self._forced_by().items()}
        self._state = RegistryState(
            self._state.generation + 1,
            providers,
            all_bounds,
            tuple(self._quarantined),
            tuple(corrections),
            fragments,
            forced,
        )

    @property
    def generation(self) -> int:
        return self._state.generation

    def state(self) -> RegistryState:
        """The current consistent view (loading the backends on first use)."""
        self._ensure_loaded()
        return self._state

    def reload(self) -> None:
        """Forget everything and rediscover (after installing a backend, or changing MAGI2_PLUGINS)."""
        with self._lock:
            self._clear()
            self._ensure_loaded()

    def _clear(self) -> None:
        """Drop every backend (withdrawing their settings) and quarantine entry; the next use rediscovers."""
        if self._fixes_config:
            for name in _LOAD_VARIABLES:
                config.release(name)
        for backend in self._backends.values():
            config.withdraw(backend.spec.name)
        self._backends.clear()
        self._quarantined.clear()
        self._providers = {op: [] for op in OPS}
        self._loaded = False

    def _config_reloaded(self) -> None:
        """After ``reload_config()``: rediscover if a backend-load variable this registry loaded with changed."""
        if self._loaded and self._discover and self._load_settings() != self._plugin_lists:
            self.reload()

    # -- queries -------------------------------------------------------------------------------
    def providers(self, op: OpName) -> list[LoadedProvider]:
        """The providers of ``op`` in resolution order (priority descending, then name)."""
        return list(self.state().providers[op])

    def provider(self, op: OpName, name: str) -> LoadedProvider | None:
        return self.state().provider(op, name)

    def boundaries(self, op: OpName) -> Mapping[str, tuple[int, ...]]:
        return self.state().bounds[op]

    def backends(self) -> list[LoadedBackend]:
        self._ensure_loaded()
        return sorted(self._backends.values(), key=lambda b: b.entry_point)

    def quarantined(self) -> tuple[QuarantinedPlugin, ...]:
        return self.state().quarantined


def _is_reference(ep: Any) -> bool:
    """The genuine reference: entry point ``reference`` of the distribution ``magi2-backend-reference``."""
    return bool(ep.name == REFERENCE and ep.dist is not None and _normalise(ep.dist.name) == REFERENCE_DIST)


def _is_reference_module(plugin: object) -> bool:
    """``plugin`` is the very function that the genuine reference entry point names, or its module (a
    registry built by hand, as tests do, may register either directly)."""
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if _is_reference(ep):
            module = sys.modules.get(ep.module)
            return module is not None and (plugin is module or plugin is getattr(module, ep.attr or "", None))
    return False


_LEGACY_HOOKS = ("magi2_sink_corrections",)  # hooks of the pluggy-era interface, gone since


def _describer(plugin: object, value: str, *, entry_point: bool) -> Callable[[], object]:
    """The function that returns ``plugin``'s spec; a ``TypeError`` says what is wrong and what to write.

    An entry point names that function (``module:magi2_backend``), or the module that defines it (the
    form of the pluggy era, still accepted, so that an install made before the change keeps loading). A
    plugin with a pluggy-era hook besides it (``magi2_sink_corrections``) is refused with what to change:
    that hook is no longer called, and its corrections would be dropped without a word.
    """
    if isinstance(plugin, BackendSpec):
        spec = plugin
        return lambda: spec
    module = isinstance(plugin, types.ModuleType)
    legacy = [h for h in _LEGACY_HOOKS if hasattr(plugin, h)]
    if legacy:
        where = (
            f"point the entry point at {value}:magi2_backend"
            if entry_point and module
            else ("register its magi2_backend function")
        )
        what = "the entry point names a module" if module else type(plugin).__name__
        raise TypeError(
            f"a pluggy-style plugin ({what} "
            f"with the hook {', '.join(legacy)}, which is no longer called); since core API "
            f"{CORE_API_VERSION} a backend is one function that returns its whole BackendSpec: {where} "
            f"and return what {', '.join(legacy)} returned inside that spec (BackendSpec(sink_corrections="
            f"...)); @hookimpl is no longer needed (docs/writing-a-backend.md)"
        )
    hook = getattr(plugin, "magi2_backend", None)
    if callable(hook):
        return hook  # type: ignore[no-any-return]
    if callable(plugin) and not module:
        return plugin
    raise TypeError(
        f"invalid plugin: a {type(plugin).__name__} is not a function returning a BackendSpec and has "
        "no magi2_backend function; an entry point names 'package.module:magi2_backend'"
    )


def _check_core_api(spec: BackendSpec) -> None:
    if not spec.core_api.strip():
        raise ValueError(
            "core_api is empty, which would claim compatibility with every core contract; "
            "declare the range this backend implements, e.g. "
            f"'>={CORE_API_VERSION},<{Version(CORE_API_VERSION).major + 1}'"
        )
    try:
        ok = Version(CORE_API_VERSION) in SpecifierSet(spec.core_api)
    except InvalidSpecifier as exc:
        raise ValueError(f"core_api {spec.core_api!r} is not a valid version specifier: {exc}") from exc
    if not ok:
        raise ValueError(
            _older_contract(spec)
            or (
                f"backend {spec.name} implements core contract {spec.core_api}, "
                f"but this magi2-core provides contract {CORE_API_VERSION}; install a matching version"
            )
        )


def _older_contract(spec: BackendSpec) -> str | None:
    """The one-line reason for a backend built for an earlier contract major (None: it was not)."""
    admitted = SpecifierSet(spec.core_api)
    for major, change in sorted(CHANGED_SINCE.items(), reverse=True):
        if any(Version(f"{major}.{minor}") in admitted for minor in range(100)):
            this = Version(CORE_API_VERSION).major
            return f"built for core API {major}, this is {this}; {change}; upgrade the backend"
    return None


# The core's variables read when the backends load (config.BACKEND_LOAD).
_LOAD_VARIABLES = tuple(name for name, var in config.VARIABLES.items() if var.read is config.BACKEND_LOAD)
_REGISTRY: Registry | None = None
_REGISTRY_LOCK = threading.Lock()


def get_registry() -> Registry:
    """The process-wide registry (created on first use)."""
    global _REGISTRY
    if _REGISTRY is None:
        with _REGISTRY_LOCK:
            if _REGISTRY is None:
                _REGISTRY = Registry()
                _REGISTRY._fixes_config = True
                config.on_reload(_REGISTRY._config_reloaded)
    return _REGISTRY


# Device profiles merge the process registry's backend fragments (the registry hands them over).
use_backend_fragments(lambda: get_registry().state().profiles)
