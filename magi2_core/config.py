"""Every ``MAGI2_*`` environment variable, declared once: type, default, documentation, parser, moment.

A variable is read from the environment the first time :func:`get` asks for it, parsed and cached.
The cache follows ``os.environ``: importing this module makes ``os.environ`` count its writes to
``MAGI2_*`` keys (:class:`_WatchedEnviron`, the same object with a subclass of its class), and
:func:`get` and the dispatcher's per-call cache compare that count with the one they last saw, so a
write is noticed by the next read without scanning the environment on every call. When a declared
variable's text changed, :func:`sync` applies the change as :func:`reload_config` would.

Each variable names its :class:`Moment`: read on every call (a change takes effect at the next call),
or read once at a moment that cannot be redone in place (backend load, vLLM plugin load), after
which the part that read it *fixes* its value (:func:`fix`) and a change is refused: the next read
raises :class:`~magi2_core.errors.ConfigChangeError` naming the variable, until the value is
restored (or, for backend load, ``reload_config()`` reloads the backends with it).

:func:`reload_config` (re-exported as ``magi2_core.reload_config``) re-reads and re-validates every
variable at once and tells the parts that cache decisions (the resolution cache, shadow verification)
to refresh. A value that does not parse raises :class:`~magi2_core.errors.ConfigError` naming the
variable, the value and what is accepted. An empty value counts as unset unless the variable says
otherwise.

The core's own variables are declared below. A backend declares the variables it reads as
:class:`~magi2_core.model.backend_spec.Setting` entries of its ``BackendSpec``: the registry adds
them (:func:`declare`), owned by the backend, while the backend is loaded, and removes them
(:func:`withdraw`) when it goes.
A part of magi2-core that is not always imported (the vllm-omni integration) declares its own the
same way, under its own owner. ``docs/configuration.md`` is generated from all of these, with each
variable's owner, by ``scripts/gen_config_doc.py``.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from magi2_core.errors import ConfigChangeError, ConfigError

if TYPE_CHECKING:
    from magi2_core.model.backend_spec import Setting

__all__ = [
    "BACKEND_LOAD",
    "CORE",
    "FALSE_WORDS",
    "EVERY_CALL",
    "MOMENTS",
    "PLUGIN_LOAD",
    "VARIABLES",
    "Moment",
    "SettingConflict",
    "TRUE_WORDS",
    "Variable",
    "boolean",
    "choice",
    "current",
    "declare",
    "effective",
    "fix",
    "fraction",
    "get",
    "looks_like_path",
    "name_list",
    "on_reload",
    "owner",
    "provider_name",
    "release",
    "reload_config",
    "seconds",
    "sync",
    "variable",
    "withdraw",
]

T = TypeVar("T")
CORE = "magi2-core"  # the owner of the variables declared in this module


@dataclass(frozen=True)
class Moment:
    """When a variable is read, and what a change of its value after that moment does.

    ``fixed``: the part that reads it keeps what it read (backends loaded, operators swapped), so a
    change afterwards is refused with :class:`~magi2_core.errors.ConfigChangeError`; otherwise the
    next read sees the change. ``reloadable``: ``reload_config()`` redoes the moment with the new value.
    """

    when: str  # the words docs/configuration.md and Setting.read use
    change: str  # what a change after the moment does, for docs/configuration.md
    fixed: bool = False
    reloadable: bool = False


EVERY_CALL = Moment(
    "every call",
    "A change takes effect at the next call (the next read notices the write to `os.environ`).",
)
BACKEND_LOAD = Moment(
    "backend load",
    "Read once, when the backends load (the first call, or `magi2 backends`); a change after that is refused: "
    "the next call raises `ConfigChangeError` naming the variable, until the old value is back or "
    "`magi2_core.reload_config()` reloads the backends with the new one.",
    fixed=True,
    reloadable=True,
)
PLUGIN_LOAD = Moment(
    "plugin load",
    "Read once, when vLLM loads the plugin, which swaps the operators then; a change after that is refused: the "
    "next call, and `magi2_core.reload_config()`, raise `ConfigChangeError` naming the variable, until the old "
    "value is back.",
    fixed=True,
)
MOMENTS: dict[str, Moment] = {m.when: m for m in (EVERY_CALL, BACKEND_LOAD, PLUGIN_LOAD)}


@dataclass(frozen=True)
class Variable(Generic[T]):
    """One environment variable: ``parse`` turns the raw text into the value or raises ``ValueError``.

    ``parse.accepted`` (when present) says in words what the parser accepts; it is quoted in errors
    and in the generated documentation.
    """

    name: str
    default: T
    doc: str
    parse: Callable[[str], T]
    empty_is_unset: bool = True
    owner: str = CORE  # who declares it and reads it: magi2-core, a backend distribution, an integration
    read: Moment = EVERY_CALL

    @property
    def accepted(self) -> str:
        return str(getattr(self.parse, "accepted", "see the description"))


class _Parser(Generic[T]):
    """A callable parser that carries the words describing what it accepts."""

    def __init__(self, accepted: str, fn: Callable[[str], T]) -> None:
        self.accepted = accepted
        self._fn = fn

    def __call__(self, raw: str) -> T:
        return self._fn(raw)


TRUE_WORDS = ("1", "true", "yes", "on")  # what a boolean setting accepts, in lower case
FALSE_WORDS = ("0", "false", "no", "off")
_TRUE, _FALSE = frozenset(TRUE_WORDS), frozenset(FALSE_WORDS)


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("not a boolean")


boolean: _Parser[bool] = _Parser("1, true, yes, on / 0, false, no, off (any case)", _bool)


def _fraction(raw: str) -> float:
    value = float(raw)  # ValueError for text
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError("outside [0, 1]")
    return value


fraction: _Parser[float] = _Parser("a number in [0, 1]", _fraction)


def _seconds(raw: str) -> float:
    value = float(raw)  # ValueError for text
    if not math.isfinite(value) or value < 0.0:
        raise ValueError("not a finite number >= 0")
    return value


seconds: _Parser[float] = _Parser("a number of seconds >= 0 (0: no limit)", _seconds)


def _names(raw: str) -> frozenset[str]:
    names = [n.strip() for n in raw.split(",")]
    if any(not n for n in names):
        raise ValueError("an empty name")
    return frozenset(names)


name_list: _Parser[frozenset[str]] = _Parser("comma-separated entry-point names, none empty", _names)


def _allow_list(raw: str) -> frozenset[str]:
    from importlib.metadata import entry_points

    names = _names(raw)
    installed = {ep.name for ep in entry_points(group="magi2_core.backends")}
    if not names <= installed:
        raise ValueError(f"not installed: {sorted(names - installed)}; installed: {sorted(installed)}")
    return names


def _deny_list(raw: str) -> frozenset[str]:
    names = _names(raw)
    if "reference" in names:
        raise ValueError("the reference backend cannot be disabled")
    return names


def choice(*values: str) -> _Parser[str]:
    def parse(raw: str) -> str:
        low = raw.strip().lower()
        if low not in values:
            raise ValueError("not one of the choices")
        return low

    return _Parser(" | ".join(values), parse)


def _provider(raw: str) -> str:
    name = raw.strip()
    if not name or any(c.isspace() or c == "," for c in name):
        raise ValueError("not a single provider name")
    return name


provider_name: _Parser[str] = _Parser("one provider name (`magi2 backends` lists them)", _provider)


def looks_like_path(value: str) -> bool:
    """A ``MAGI2_PROFILE`` value that names a file rather than a profile."""
    return value.endswith(".json") or "/" in value or os.sep in value or value.startswith("~")


def _profile(raw: str) -> str:
    value = raw.strip()
    if value.lower() == "generic":
        return "generic"
    if looks_like_path(value):
        from magi2_core.profiles.model import load_profile  # here: profiles import this module

        path = os.path.abspath(os.path.expanduser(value))
        load_profile(path)  # a ProfileError (a ValueError) names the file and the field
        return path
    if not all(c.isalnum() or c in "._-" for c in value):
        raise ValueError("neither a profile name nor a path to a .json file")
    return value


profile_choice: _Parser[str] = _Parser(
    "`generic`, the name of a shipped profile (`magi2 tune --show` lists the active one), or the path of a "
    "profile file (.json)",
    _profile,
)

_PROVIDER_DOC = (
    "Force the {what} provider for every call, unless a `provider=` argument or `magi2_core.use(...)` "
    "names one. An unknown name raises listing the installed ones; a forced provider that cannot serve a "
    "call raises with its reasons."
)
_PROVIDER_KEYS = (
    ("attention", "attention"),
    ("moe", "MoE (`moe_route` and `moe_experts`, where a provider of that name exists)"),
    ("moe_route", "`moe_route` (beats `MAGI2_MOE_PROVIDER`)"),
    ("moe_experts", "`moe_experts` (beats `MAGI2_MOE_PROVIDER`)"),
    ("rmsnorm", "RMSNorm"),
    ("mhc", "mHC (`mhc_pre` and `mhc_mix`, where a provider of that name exists)"),
    ("mhc_pre", "`mhc_pre` (beats `MAGI2_MHC_PROVIDER`)"),
    ("mhc_mix", "`mhc_mix` (beats `MAGI2_MHC_PROVIDER`)"),
    ("qk_norm_rope", "`qk_norm_rope` (the q/k norm, gather and RoPE)"),
    ("output_gate", "`output_gate` (attention's output gather and sigmoid gate)"),
)

_DECLARED: tuple[Variable[Any], ...] = (
    Variable(
        "MAGI2_PLUGINS",
        None,
        "Allow-list of backend entry points to load (the `reference` backend is always loaded). "
        "A name that is not installed is an error; an empty value is an error (unset it to load "
        "every backend).",
        _Parser("comma-separated names of installed backend entry points", _allow_list),
        empty_is_unset=False,
        read=BACKEND_LOAD,
    ),
    Variable(
        "MAGI2_DISABLE_PLUGINS",
        None,
        "Deny-list of backend entry points not to load. Naming `reference` is an error: the exact "
        "reference is the yardstick of `magi2 check` and shadow verification and cannot be disabled.",
        _Parser("comma-separated entry-point names, none empty, not `reference`", _deny_list),
        read=BACKEND_LOAD,
    ),
    Variable(
        "MAGI2_PLUGIN_IMPORT_TIMEOUT",
        30.0,
        "Seconds a backend's entry point may take to import. One that takes longer (a hung network "
        "filesystem, a driver that waits for a device) is quarantined with that reason and the registry "
        "goes on without it; its import keeps running in a background thread. Descriptors are meant to "
        "import in well under a second; 0 waits for ever.",
        seconds,
        read=BACKEND_LOAD,
    ),
    *(
        Variable(f"MAGI2_{key.upper()}_PROVIDER", None, _PROVIDER_DOC.format(what=what), provider_name)
        for key, what in _PROVIDER_KEYS
    ),
    Variable(
        "MAGI2_PROFILE",
        None,
        "The device profile that orders the eligible providers (docs/profiles.md), for calls on its device "
        "type: a profile file, a shipped profile by name, or `generic` (no measurements: the descriptors' "
        "priorities decide). Unset: the profile `magi2 tune` wrote for this device, else the shipped one "
        "for this device, else the generic one. Overrides (`provider=`, `use(...)`, `MAGI2_*_PROVIDER`) "
        "still win over every profile.",
        profile_choice,
    ),
    Variable(
        "MAGI2_SHADOW",
        0.0,
        "Fraction of op calls re-run on the reference and judged by the op's contract (0 = off).",
        fraction,
    ),
    Variable(
        "MAGI2_SHADOW_RAISE",
        False,
        "Raise `ShadowMismatchError` on a shadowed result outside the contract (default: warn).",
        boolean,
    ),
    Variable(
        "MAGI2_CHECK_DEVICE_VALUES",
        False,
        "Also range-check values that live on an accelerator (expert ids, prefix sums); costs a host "
        "sync per call. `magi2_core.set_device_value_checks()` overrides it at run time.",
        boolean,
    ),
    Variable(
        "MAGI2_DETERMINISTIC",
        False,
        "What `deterministic=None`, the default of `attention` and `moe_experts`, means: ask providers for "
        "run-to-run identical results. An explicit `deterministic=True/False` wins.",
        boolean,
    ),
    Variable(
        "MAGI2_STRICT",
        False,
        "Strict mode: a call on an accelerator that falls to the `reference` provider by priority raises "
        "`StrictModeError` (naming why every faster provider was rejected) instead of running the slow "
        "reference; a provider forced by `provider=`, `use(...)` or `MAGI2_*_PROVIDER` is exempt. "
        "`magi2_core.set_strict()` overrides this variable.",
        boolean,
    ),
)
VARIABLES: dict[str, Variable[Any]] = {v.name: v for v in _DECLARED}

_lock = threading.RLock()
_values: dict[str, Any] = {}
generation = 0  # bumped by every successful reload_config() and every applied sync()
_listeners: list[Callable[[], None]] = []
_fixed: dict[str, Any] = {}  # name -> the value the part that read it at its moment keeps using
PREFIX = "MAGI2_"


# -- noticing writes to os.environ ---------------------------------------------------------------------
class _Watch:
    """``writes``: how many times a ``MAGI2_*`` key of ``os.environ`` was set or deleted; ``synced``: the
    count when the cache last matched the environment. The two differ exactly when a write is unseen."""

    __slots__ = ("synced", "writes")

    def __init__(self) -> None:
        self.writes = 0
        self.synced = 0


WATCH = _Watch()


def _watched(base: type[os._Environ[str]]) -> type[os._Environ[str]]:
    """A subclass of ``os.environ``'s class whose ``__setitem__``/``__delitem__`` count ``MAGI2_*`` writes.

    Every other way to change ``os.environ`` (``update``, ``pop``, ``setdefault``, ``clear``, ``|=``,
    ``mock.patch.dict``, pytest's ``monkeypatch``) goes through these two.
    """

    def __setitem__(self: Any, key: Any, value: Any) -> None:
        base.__setitem__(self, key, value)
        if isinstance(key, str) and key.startswith(PREFIX):
            WATCH.writes += 1

    def __delitem__(self: Any, key: Any) -> None:
        base.__delitem__(self, key)
        if isinstance(key, str) and key.startswith(PREFIX):
            WATCH.writes += 1

    return type(
        "_WatchedEnviron",
        (base,),
        {"__setitem__": __setitem__, "__delitem__": __delitem__, "_magi2_watched": True, "__module__": __name__},
    )


def watch_environ() -> bool:
    """Make ``os.environ`` count its ``MAGI2_*`` writes (once; done at import). The object stays the same
    (its class becomes a subclass of its own); False when it is not an ``os._Environ`` and cannot be watched."""
    env: object = os.environ
    if getattr(type(env), "_magi2_watched", False):
        return True
    if not isinstance(env, os._Environ):
        return False
    env.__class__ = _watched(type(env))
    return True


def _snapshot() -> dict[str, str]:
    return {k: v for k, v in list(os.environ.items()) if k.startswith(PREFIX)}


_seen_env: dict[str, str] = _snapshot()  # the MAGI2_* items of os.environ at the last sync
if not watch_environ():
    logging.getLogger("magi2_core").warning(
        "magi2_core: os.environ is a %s, not os._Environ, so a change of a MAGI2_* variable is not noticed by "
        "itself: call magi2_core.reload_config() after changing one",
        type(os.environ).__name__,
    )


def _parse(var: Variable[Any]) -> Any:
    return _parse_text(var, os.environ.get(var.name))


def _parse_text(var: Variable[Any], raw: str | None) -> Any:
    if raw is None or (var.empty_is_unset and not raw.strip()):
        return var.default
    try:
        return var.parse(raw)
    except (ValueError, TypeError) as exc:
        raise ConfigError(var.name, raw, var.accepted, str(exc)) from None


def get(name: str) -> Any:
    """The parsed value of ``name`` as ``os.environ`` holds it (parsed once per change, then cached)."""
    if WATCH.writes != WATCH.synced:
        sync()
    try:
        return _values[name]
    except KeyError:
        pass
    var = VARIABLES.get(name)
    if var is None:
        raise KeyError(f"{name} is not a declared magi2 configuration variable; declared: {sorted(VARIABLES)}")
    value = _parse(var)
    with _lock:
        if name in VARIABLES:  # not withdrawn meanwhile
            _values[name] = value
    return value


def current(name: str) -> Any:
    """The same as :func:`get` (every read follows ``os.environ``); kept for callers that used it."""
    return get(name)


def effective() -> dict[str, object]:
    """Every declared variable with its effective value (parsing any not read yet)."""
    return {name: get(name) for name in list(VARIABLES)}


def on_reload(listener: Callable[[], None]) -> None:
    """Call ``listener`` after every :func:`reload_config` and every applied :func:`sync` (cached
    decisions that depend on the config)."""
    _listeners.append(listener)


def fix(name: str) -> None:
    """Record that the value of ``name`` read now stays in use (the moment it is read cannot be redone in
    place): a later change is refused by :func:`sync` and, unless its moment is reloadable, by
    :func:`reload_config`."""
    value = get(name)
    with _lock:
        _fixed[name] = value


def release(name: str) -> None:
    """Forget :func:`fix` of ``name`` (its reader let go of the value: unloaded, unregistered)."""
    with _lock:
        _fixed.pop(name, None)


def _refuse_fixed(fresh: dict[str, Any], raw: dict[str, str], explicit: bool) -> None:
    """Raise ``ConfigChangeError`` for the first variable in ``fresh`` whose fixed value it would change."""
    for name, value in fresh.items():
        var = VARIABLES.get(name)
        if var is None or name not in _fixed or _fixed[name] == value or (explicit and var.read.reloadable):
            continue
        remedy = (
            "restore it, or call magi2_core.reload_config() to reload the backends with it"
            if var.read.reloadable
            else "restore it (the value in use cannot change in this process)"
        )
        raise ConfigChangeError(name, raw.get(name), var.read.when, _fixed[name], remedy)


def _apply(fresh: dict[str, Any], env: dict[str, str], writes: int, *, replace: bool) -> None:
    global generation, _seen_env
    with _lock:
        if replace:
            _values.clear()
        _values.update(fresh)
        for name, value in fresh.items():
            if name in _fixed and _fixed[name] != value:  # allowed by _refuse_fixed: a reloadable moment
                del _fixed[name]  # its reader redoes the moment (a listener) and fixes the new value
        _seen_env = env
        WATCH.synced = writes
        generation += 1
    for listener in list(_listeners):
        listener()


def sync() -> None:
    """Bring the cache up to ``os.environ`` after a write to a ``MAGI2_*`` key (called by reads that notice
    one). The declared variables whose text changed are parsed again and applied as a whole, as
    :func:`reload_config` applies; on a bad value or a refused change nothing changes and the error is
    raised again at every read until the environment is put right."""
    global _seen_env
    with _lock:
        writes = WATCH.writes  # before the snapshot: a write during it is noticed next time
        env = _snapshot()
        changed = {k for k in env.keys() | _seen_env.keys() if env.get(k) != _seen_env.get(k)}
        # Only the cached ones: a variable not read yet is parsed from the new text by its first get().
        stale = [VARIABLES[k] for k in changed if k in VARIABLES and k in _values]
        if not stale:
            _seen_env = env
            WATCH.synced = writes
            return
    fresh = {var.name: _parse_text(var, env.get(var.name)) for var in stale}
    _refuse_fixed(fresh, env, explicit=False)
    _apply(fresh, env, writes, replace=False)


def reload_config() -> dict[str, object]:
    """Re-read every ``MAGI2_*`` variable now; raise ``ConfigError`` if any is invalid.

    On an error nothing changes: the previous values stay in force. A variable fixed at a moment
    that cannot be redone (vLLM plugin load) and changed since raises ``ConfigChangeError``; one
    fixed at backend load is taken, and the backend registry reloads with it. Returns :func:`effective`.
    """
    watch_environ()
    writes = WATCH.writes
    env = _snapshot()
    fresh = {name: _parse(var) for name, var in list(VARIABLES.items())}
    _refuse_fixed(fresh, env, explicit=True)
    _apply(fresh, env, writes, replace=True)
    return dict(fresh)


# -- variables declared by others ---------------------------------------------------------------------
class SettingConflict(ValueError):
    """A setting names a variable that another owner (or the same owner, differently) already declares."""


_PARSERS: dict[str, _Parser[Any]] = {"boolean": boolean, "fraction": fraction, "seconds": seconds}
# name -> (the declared Setting, how many loaded declarations hold it); the core's own are not here.
_declared: dict[str, tuple[Setting, int]] = {}


def variable(setting: Setting, owner: str) -> Variable[Any]:
    """The :class:`Variable` that ``setting`` declares for ``owner`` (not added anywhere)."""
    parse = _PARSERS.get(setting.kind) or choice(*setting.choices)
    return Variable(setting.name, setting.default, setting.help, parse, owner=owner, read=MOMENTS[setting.read])


def owner(name: str) -> str | None:
    """Who declares the variable ``name`` now (None: nobody)."""
    var = VARIABLES.get(name)
    return var.owner if var is not None else None


def declare(setting: Setting, owner: str) -> None:
    """Add ``setting``'s variable, owned by ``owner``; its value is read on first :func:`get`.

    Declaring the same setting again for the same owner (the backend loaded by a second registry) is
    counted, not an error: the variable stays until every declaration is withdrawn. Raises
    :class:`SettingConflict`, naming both owners, when the name is declared otherwise.
    """
    with _lock:
        existing = VARIABLES.get(setting.name)
        held = _declared.get(setting.name)
        if existing is not None:
            if held is None or existing.owner != owner or held[0] != setting:
                mine = "differently by the same owner" if existing.owner == owner else f"by {existing.owner}"
                raise SettingConflict(
                    f"{setting.name} is already declared {mine}; {owner} declares it too: "
                    f"rename {owner}'s setting (or drop it and read {existing.owner}'s)"
                )
            _declared[setting.name] = (setting, held[1] + 1)
            return
        VARIABLES[setting.name] = variable(setting, owner)
        _declared[setting.name] = (setting, 1)


def withdraw(owner: str) -> None:
    """Withdraw one declaration of each variable ``owner`` declared (the core's own stay)."""
    with _lock:
        for name, (setting, count) in list(_declared.items()):
            if VARIABLES[name].owner != owner:
                continue
            if count > 1:
                _declared[name] = (setting, count - 1)
                continue
            del _declared[name], VARIABLES[name]
            _values.pop(name, None)
            _fixed.pop(name, None)
