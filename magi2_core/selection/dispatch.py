"""The hot path's memoised resolution: the :class:`Dispatcher`, the process-wide one the op calls use,
and the run-time switches that invalidate its cached decisions (strict mode, device value checks).

The :class:`Dispatcher` caches the chosen kernel by the call's typed key (each op's ``NamedTuple``
in :mod:`magi2_core.ops`): device, dtype, feature mask and each integer field *bucketed* by the
boundaries that the installed descriptors and the device profiles' rows use, plus the active
overrides. A new sequence length reuses the cached decision unless it crosses a boundary. The cache
belongs to one registry generation: a call that sees a newer generation starts a fresh cache, and
each resolution reads one consistent :class:`~magi2_core.selection.registry.RegistryState`, so a backend
registered or unregistered while other threads run ops never leaves a half-built list or a stale
kernel behind. What is chosen, and why, is :mod:`magi2_core.selection.resolver`'s business.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from magi2_core import config
from magi2_core.config import WATCH
from magi2_core.contracts._checks import replace_device_value_checks
from magi2_core.model.problem import HEAD, OpName
from magi2_core.profiles.active import boundaries as profile_boundaries
from magi2_core.selection.overrides import context_token
from magi2_core.selection.registry import Registry, get_registry
from magi2_core.selection.resolver import resolve_in
from magi2_core.selection.strict import check_resolution, replace_strict

if TYPE_CHECKING:
    from magi2_core.ops._spec import OpSpec

__all__ = ["Bound", "CacheKey", "Dispatcher", "dispatcher", "set_device_value_checks", "set_strict"]


def _merged(*parts: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The union of boundary maps (descriptors', profiles'), each field's values sorted."""
    out: dict[str, set[int]] = {}
    for part in parts:
        for fld, values in part.items():
            out.setdefault(fld, set()).update(values)
    return {f: tuple(sorted(v)) for f, v in out.items()}


class CacheKey(NamedTuple):
    """The resolution cache's key: the op's typed problem key with its integer fields bucketed."""

    op: OpName
    provider: str | None
    overrides: tuple[tuple[str, str], ...]  # the use(...) context (env overrides: cleared on a config change)
    head: tuple[Any, ...]  # (device, dtype, out_dtype, feature mask), as in the op's key
    buckets: tuple[int | None, ...]  # per bucketed field: the index of its value among the boundaries


class Bound(NamedTuple):
    """A resolved provider for a call: the kernel object and the provider's name."""

    kernel: Any
    provider: str


_Plan = tuple[tuple[int, tuple[int, ...]], ...]  # (position in the op's key, boundaries) per bucketed field


class _Slot(NamedTuple):
    generation: int
    cache: dict[CacheKey, Bound]
    plans: dict[OpName, _Plan]
    bound: dict[tuple[Any, ...], Any]  # the ops' caches of validated call layouts (see magi2_core.ops)


class Dispatcher:
    """Memoised resolution for op calls.

    Two caches, both dropped together when the registry changes, the configuration changes (a write to
    a ``MAGI2_*`` key of ``os.environ``, noticed here on every call, or ``reload_config()``) or strict
    mode / device-value checks are switched: :meth:`kernel` maps a typed problem key, bucketed by
    the boundaries the installed descriptors use, to the provider; :meth:`bound_calls` is where each
    op keeps its validated call layouts (argument shapes, dtypes, devices and scalars -> normalised
    values and the provider), so that a repeated call is a tuple build and one dict lookup.
    """

    # Past this many distinct call layouts an op's bound-call cache starts again (a serving loop sees
    # a handful; a sweep over host-side sequence lengths would otherwise grow it without limit).
    BOUND_LIMIT = 4096

    def __init__(self, registry: Registry | None = None) -> None:
        self._registry = registry or get_registry()
        # Replaced as one tuple and never mutated across generations: a cache only ever holds
        # decisions made from the registry state of its tag.
        self._slot = _Slot(-1, {}, {}, {})
        config.on_reload(self.clear)  # the environment's provider overrides are part of every decision

    def clear(self) -> None:
        self._slot = _Slot(-1, {}, {}, {})

    def bound_calls(self) -> dict[tuple[Any, ...], Any]:
        """The current generation's cache of validated call layouts (empty after any change)."""
        if WATCH.writes != WATCH.synced:  # a MAGI2_* variable was written since the last read
            config.sync()  # a change clears this cache (on_reload); a refused or bad one raises here
        slot = self._slot
        # The registry's generation property, read without its frame: this runs on every op call.
        if slot.generation != self._registry._state.generation:
            slot = self._fresh_slot(self._registry.state().generation)  # state(): loads on first use
        return slot.bound

    def _fresh_slot(self, generation: int) -> _Slot:
        """Empty caches tagged with ``generation`` (kept when another thread made them already)."""
        slot = self._slot
        if slot.generation != generation:
            slot = self._slot = _Slot(generation, {}, {}, {})
        return slot

    def kernel(self, spec: OpSpec[Any, Any], key: tuple[Any, ...], provider: str | None) -> Bound:
        """The provider to run for a call with this typed key (resolving and caching on a miss)."""
        state = self._registry.state()
        slot = self._slot
        if slot.generation != state.generation:
            slot = self._fresh_slot(state.generation)
        op = spec.name
        buckets = slot.plans.get(op)
        if buckets is None:
            bounds = _merged(state.bounds[op], profile_boundaries(op, state.profiles))
            fields = spec.int_fields
            buckets = slot.plans[op] = tuple((len(HEAD) + i, bounds[f]) for i, f in enumerate(fields) if f in bounds)
        cache_key = CacheKey(
            op,
            provider,
            context_token(),
            tuple(key[: len(HEAD)]),
            tuple([None if key[i] is None else bisect_right(b, key[i]) for i, b in buckets]),
        )
        bound = slot.cache.get(cache_key)
        if bound is None:
            res = resolve_in(spec.problem(key), provider, state)
            check_resolution(cache_key, res)  # logs the new decision; strict mode raises here
            chosen = state.provider(op, res.chosen or "")
            if chosen is None:  # resolved from this very state, so the name is in it
                raise RuntimeError(f"{op}: resolved provider {res.chosen!r} is missing from its registry state")
            bound = slot.cache[cache_key] = Bound(chosen.load()[0], chosen.name)
        return bound


_DISPATCHER: Dispatcher | None = None


def dispatcher() -> Dispatcher:
    """The process-wide memoised resolver used by the op calls."""
    global _DISPATCHER
    d = _DISPATCHER
    if d is None:
        d = _DISPATCHER = Dispatcher(get_registry())
    return d


def set_strict(enabled: bool | None) -> bool | None:
    """Turn strict mode on (``True``) or off (``False``) for the process, over ``MAGI2_STRICT``;
    ``None`` follows the variable again. Returns the previous setting (passing it back restores it).

    Only ``True``, ``False`` and ``None`` are accepted: a string such as ``"no"`` is truthy, and
    ``bool("no")`` would have turned strict mode on. Clears the op dispatcher's cache, so that a
    decision cached before the switch is judged again.
    """
    previous = replace_strict(enabled)
    dispatcher().clear()
    return previous


def set_device_value_checks(enabled: bool | None) -> bool | None:
    """Turn host-syncing checks of device-resident values on or off (``None``: follow
    ``MAGI2_CHECK_DEVICE_VALUES``); returns the previous setting, which restores it when passed back.
    Clears the ops' cached call layouts, which were validated under the old setting."""
    previous = replace_device_value_checks(enabled)
    dispatcher().clear()
    return previous
