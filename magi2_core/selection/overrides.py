"""Provider overrides: ``provider=`` argument > ``use(...)`` context > environment > priority.

``use(attention="reference", moe="triton")`` sets overrides for a scope (a ContextVar: nestable,
thread- and task-safe). Keys are op families (``attention``, ``moe``, ``rmsnorm``) or single ops
(``moe_route``, ``moe_experts``). A family-level name applies to the ops of the family that have a
provider of that name; the others fall through to the next layer. The environment works the same:
``MAGI2_ATTENTION_PROVIDER``, ``MAGI2_MOE_PROVIDER``, ``MAGI2_RMSNORM_PROVIDER`` and per op
``MAGI2_MOE_ROUTE_PROVIDER``, ``MAGI2_MOE_EXPERTS_PROVIDER``, read through :mod:`magi2_core.config`
(once; ``magi2_core.reload_config()`` re-reads them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

from magi2_core import config
from magi2_core.errors import InvalidValueError
from magi2_core.model.problem import OpName

__all__ = [
    "FAMILY",
    "KEYS",
    "context_token",
    "env_overrides",
    "env_var",
    "env_vars",
    "key_ops",
    "layered_overrides",
    "set_name_check",
    "use",
]

FAMILY: dict[OpName, str] = {
    "attention": "attention",
    "moe_route": "moe",
    "moe_experts": "moe",
    "rmsnorm": "rmsnorm",
    "mhc_pre": "mhc",
    "mhc_mix": "mhc",
    "qk_norm_rope": "qk_norm_rope",
    "output_gate": "output_gate",
}
_KEYS = frozenset(FAMILY) | frozenset(FAMILY.values())
# in the env variables' order
KEYS: tuple[str, ...] = (
    "attention",
    "moe",
    "moe_route",
    "moe_experts",
    "rmsnorm",
    "mhc",
    "mhc_pre",
    "mhc_mix",
    "qk_norm_rope",
    "output_gate",
)
# A sorted tuple of (key, provider) pairs: hashable, so it can be part of the resolution cache key.
_OVERRIDES: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("magi2_overrides", default=())


def env_var(key: str) -> str:
    return f"MAGI2_{key.upper()}_PROVIDER"


def env_vars(op: OpName) -> tuple[str, ...]:
    """The environment variables that can force a provider for ``op``, strongest first."""
    family = FAMILY[op]
    return (env_var(family),) if family == op else (env_var(op), env_var(family))


def key_ops(key: str) -> tuple[OpName, ...]:
    """The ops an override key applies to: the op itself, or every op of the family."""
    return (key,) if key in FAMILY else tuple(op for op, family in FAMILY.items() if family == key)


def env_overrides() -> dict[str, str]:
    """Every ``MAGI2_*_PROVIDER`` variable that is set, by variable name."""
    out: dict[str, str] = {}
    for key in KEYS:
        name = config.get(env_var(key))
        if name:
            out[env_var(key)] = name
    return out


# Checks the provider names of a ``use(...)`` block on entry; the resolver registers the one that knows
# the installed providers (this module sits below the registry and cannot ask it).
_name_check: Callable[[Mapping[str, str]], None] | None = None


def set_name_check(check: Callable[[Mapping[str, str]], None]) -> None:
    global _name_check
    _name_check = check


@contextmanager
def use(**providers: str | None) -> Iterator[None]:
    """Force providers inside a ``with`` block; ``None`` lifts an outer override for that key.

    Keys are ops (``moe_route``) or families (``attention``, ``moe``, ``rmsnorm``). A name that no
    installed provider of the key's ops has raises :class:`~magi2_core.errors.UnknownProviderError`
    on entry, listing the valid names; a valid name that cannot serve a call raises at that call.

    >>> import magi2_core as m2
    >>> with m2.use(attention="reference"):
    ...     pass
    """
    unknown = sorted(set(providers) - _KEYS)
    if unknown:
        raise InvalidValueError("use", ", ".join(unknown), f"one of {sorted(_KEYS)}", "unknown key(s)")
    bad = {k: v for k, v in providers.items() if v is not None and not isinstance(v, str)}
    if bad:
        key, name = next(iter(bad.items()))
        raise InvalidValueError("use", key, "a provider name (str) or None", repr(name))
    named = {k: v for k, v in providers.items() if v is not None}
    if named and _name_check is not None:
        _name_check(named)  # an unknown name raises here, on entry, naming the valid ones
    merged = dict(_OVERRIDES.get())
    for key, name in providers.items():
        if name is None:
            merged.pop(key, None)
        else:
            merged[key] = name
    token = _OVERRIDES.set(tuple(sorted(merged.items())))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


# The hashable form of the current context's overrides (for cache keys): the ContextVar's own getter,
# so that every op call reads it without a Python frame of ours.
context_token = _OVERRIDES.get


def layered_overrides(op: OpName) -> tuple[tuple[str, str, bool], ...]:
    """The override layers that name a provider for ``op``, strongest first.

    Each item is ``(source, name, family_level)`` with source ``context`` or ``env``; a
    family-level name may be skipped by the resolver when this op has no provider of that name.
    """
    family = FAMILY[op]
    out: list[tuple[str, str, bool]] = []
    ctx = dict(_OVERRIDES.get())
    if ctx:
        if op in ctx:
            out.append(("context", ctx[op], False))
        if family != op and family in ctx:
            out.append(("context", ctx[family], True))
    if op != family:
        name = config.get(env_var(op))
        if name:
            out.append(("env", name, False))
    name = config.get(env_var(family))
    if name:
        out.append(("env", name, family != op))
    return tuple(out)
