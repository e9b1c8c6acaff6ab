"""Shadow verification: re-run a sampled fraction of op calls on the reference and compare.

Off by default; when off, an op call pays one ContextVar read. Turn it on for the process with
``MAGI2_SHADOW=0.01`` (the sampled fraction; read through :mod:`magi2_core.config`, re-read by
``magi2_core.reload_config()``; ``MAGI2_SHADOW_RAISE=1`` raises on a mismatch) or :func:`configure`,
or for a scope::

    with magi2_core.selection.shadow.shadow(rate=0.05, raise_on_mismatch=False):
        model(x)
    print(magi2_core.selection.shadow.stats())

A scope is a ContextVar, like ``use()``: it covers the block in this thread or task only, nests (the
innermost wins; ``rate=0`` turns shadowing off inside), and outside any scope the process setting
applies. A sampled call is re-run on the ``reference`` provider with the same normalised inputs (on
the same device) and judged by the op's acceptance rule (its spec in :mod:`magi2_core.ops`). A result
outside the contract gives a :class:`ShadowMismatchWarning` naming the op, provider and metric, a
counter in :func:`stats`, and, when asked, a :class:`ShadowMismatchError`. Calls served by the
reference itself are not re-run. Compiled graphs run each op through the same path when they execute
(the ops are opaque custom ops), so they are observed too.
"""

from __future__ import annotations

import random
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from magi2_core import config
from magi2_core.errors import Magi2Error
from magi2_core.model.problem import OpName
from magi2_core.selection.registry import get_registry

if TYPE_CHECKING:
    from magi2_core.ops._spec import OpSpec

__all__ = [
    "ShadowMismatchError",
    "ShadowMismatchWarning",
    "ShadowStats",
    "configure",
    "is_active",
    "observe",
    "reset_stats",
    "sampling",
    "settings",
    "shadow",
    "stats",
]

REFERENCE = "reference"


@dataclass(frozen=True)
class _Scope:
    """One shadow setting: the sampled fraction, whether to raise, and its own random stream."""

    rate: float
    raise_on_mismatch: bool
    rng: random.Random = field(compare=False)


_OFF = _Scope(0.0, False, random.Random())
# The innermost shadow() scope of this context; None outside any: the process setting applies.
_SCOPE: ContextVar[_Scope | None] = ContextVar("magi2_shadow", default=None)
_process = _OFF  # set by configure() and from MAGI2_SHADOW / MAGI2_SHADOW_RAISE
_lock = threading.Lock()
_local = threading.local()  # re-entrancy guard: the reference run must not be observed itself


class ShadowMismatchError(Magi2Error):
    """A shadowed call's result is outside the op's contract; ``op``, ``provider``, ``metric``, ``detail``."""

    def __init__(self, op: str, provider: str, metric: str, detail: str) -> None:
        self.op, self.provider, self.metric, self.detail = op, provider, metric, detail
        super().__init__(f"magi2 shadow: {op} provider {provider!r} is outside the contract ({metric}): {detail}")


class ShadowMismatchWarning(UserWarning):
    """Warned for every shadowed call whose result is outside the contract."""


@dataclass
class ShadowStats:
    """Counters since the last :func:`reset_stats`; ``by_provider`` maps ``"op:provider"`` to its counters."""

    observed: int = 0
    sampled: int = 0
    compared: int = 0
    mismatches: int = 0
    skipped_reference: int = 0
    errors: int = 0
    by_provider: dict[str, dict[str, int]] = field(default_factory=dict)

    def bump(self, key: str, name: str) -> None:
        setattr(self, name, getattr(self, name) + 1)
        per = self.by_provider.setdefault(key, {"sampled": 0, "compared": 0, "mismatches": 0, "errors": 0})
        if name in per:
            per[name] += 1


_stats = ShadowStats()


def _scope(rate: float, raise_on_mismatch: bool, seed: int | None) -> _Scope:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"shadow rate must be in [0, 1]; got {rate}")
    return _Scope(float(rate), bool(raise_on_mismatch), random.Random(seed))


def configure(rate: float, *, raise_on_mismatch: bool = False, seed: int | None = None) -> None:
    """Set the process setting: the sampled fraction outside any :func:`shadow` scope (0 turns it off)."""
    global _process
    _process = _scope(rate, raise_on_mismatch, seed)


@contextmanager
def shadow(rate: float = 1.0, *, raise_on_mismatch: bool = False, seed: int | None = None) -> Iterator[None]:
    """Shadow-verify ``rate`` of the op calls inside the block (this thread or task; nestable)."""
    token = _SCOPE.set(_scope(rate, raise_on_mismatch, seed))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def sampling() -> _Scope | None:
    """The setting in force here when it samples anything, else None (:func:`observed` reads the same, inline)."""
    scope = _SCOPE.get() or _process
    return scope if scope.rate > 0.0 else None


def settings() -> tuple[float, bool]:
    """``(rate, raise_on_mismatch)`` in force here: the innermost scope's, else the process setting."""
    scope = _SCOPE.get() or _process
    return scope.rate, scope.raise_on_mismatch


def is_active() -> bool:
    """Whether op calls here are shadow-verified at all."""
    return sampling() is not None


def stats() -> ShadowStats:
    """A snapshot of the counters."""
    with _lock:
        return ShadowStats(
            _stats.observed,
            _stats.sampled,
            _stats.compared,
            _stats.mismatches,
            _stats.skipped_reference,
            _stats.errors,
            {k: dict(v) for k, v in _stats.by_provider.items()},
        )


def reset_stats() -> None:
    global _stats
    with _lock:
        _stats = ShadowStats()


def _reference_kernel(op: OpName) -> Any:
    p = get_registry().provider(op, REFERENCE)
    if p is None:
        raise RuntimeError(f"{op}: no reference provider is installed to shadow against")
    kernel, error = p.load()
    if error is not None:
        raise RuntimeError(error)
    return kernel


_Out = TypeVar("_Out")


def observed(spec: OpSpec[Any, Any], provider: str, call: Any, out: _Out) -> _Out:
    """What an op returns after its kernel: ``out``, handed to :func:`observe` first where shadow
    verification samples (the scope's setting read here, as :func:`sampling` does)."""
    scope = _SCOPE.get() or _process
    if scope.rate > 0.0:
        observe(scope, spec, provider, call, out)
    return out


def observe(scope: _Scope, spec: OpSpec[Any, Any], provider: str, call: Any, out: Any) -> None:
    """Called by :func:`observed` after an op's kernel ran, with the :func:`sampling` setting: maybe re-run and compare.

    ``call`` is the op's validated call, ``out`` what ``provider``'s kernel returned. Runs under
    ``torch.no_grad``; never modifies ``out``.
    """
    if getattr(_local, "busy", False):
        return
    op = spec.name
    with _lock:
        _stats.observed += 1
        sampled = scope.rng.random() < scope.rate
    if not sampled:
        return
    key = f"{op}:{provider}"
    if provider == REFERENCE:
        with _lock:
            _stats.skipped_reference += 1
        return
    with _lock:
        _stats.bump(key, "sampled")
    _local.busy = True
    try:
        with torch.no_grad():
            ref = spec.run(_reference_kernel(op), call)
            verdicts = spec.accept(call.key, spec.outputs(out), spec.outputs(ref), call)
    except Exception as exc:  # the shadow must never take the serving call down with it
        with _lock:
            _stats.bump(key, "errors")
        warnings.warn(
            f"magi2 shadow: could not verify {op} provider {provider!r}: {type(exc).__name__}: {exc}",
            ShadowMismatchWarning,
            stacklevel=3,
        )
        return
    finally:
        _local.busy = False
    bad = next((v for v in verdicts if not v.ok), None)
    with _lock:
        _stats.bump(key, "compared")
        if bad is not None:
            _stats.bump(key, "mismatches")
    if bad is None:
        return
    if scope.raise_on_mismatch:
        raise ShadowMismatchError(op, provider, bad.metric, bad.detail)
    warnings.warn(
        f"magi2 shadow: {op} provider {provider!r} is outside the contract ({bad.metric}): {bad.detail}",
        ShadowMismatchWarning,
        stacklevel=3,
    )


def _from_config() -> None:
    configure(config.get("MAGI2_SHADOW"), raise_on_mismatch=config.get("MAGI2_SHADOW_RAISE"))


config.on_reload(_from_config)
_from_config()
