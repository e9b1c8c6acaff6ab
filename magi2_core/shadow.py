"""Shadow verification: re-run a sampled fraction of op calls on the reference and compare.

Off by default. When off, the only cost in an op call is reading the module-global ``ACTIVE``.
Turn it on for a process with ``MAGI2_SHADOW=0.01`` (the sampled fraction; read when magi2_core is
imported and by ``magi2_core.reload_config()``; ``MAGI2_SHADOW_RAISE=1`` raises on a mismatch) or for a
block::

    with magi2_core.shadow.shadow(rate=0.05, raise_on_mismatch=False):
        model(x)
    print(magi2_core.shadow.stats())

A sampled call is re-run on the ``reference`` provider with the same normalised inputs (on the same
device) and judged by the op's acceptance rule (:mod:`magi2_core.contracts.acceptance`). A result
outside the contract gives a :class:`ShadowMismatchWarning` naming the op, provider and metric, a
counter in :func:`stats`, and, when asked, a :class:`ShadowMismatchError`. Calls served by the
reference itself are not re-run. The setting is process-wide (the hot path reads one global).
Compiled graphs run each op through the same path when they execute (the ops are opaque custom
ops), so they are observed too.
"""

from __future__ import annotations

import random
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from magi2_core import config
from magi2_core.contracts import acceptance as acc
from magi2_core.errors import Magi2Error
from magi2_core.problem import OpName

__all__ = [
    "ACTIVE",
    "ShadowMismatchError",
    "ShadowMismatchWarning",
    "ShadowStats",
    "configure",
    "observe",
    "reset_stats",
    "shadow",
    "stats",
]

REFERENCE = "reference"

ACTIVE = False
_rate = 0.0
_raise = False
_rng = random.Random()
_lock = threading.Lock()
_local = threading.local()  # re-entrancy guard: the reference run must not be observed itself


class ShadowMismatchError(Magi2Error):
    """A shadowed call's result is outside the op's contract; ``op``, ``provider``, ``metric``, ``detail``."""

    def __init__(self, op: str, provider: str, metric: str, detail: str) -> None:
        self.op, self.provider, self.metric, self.detail = op, provider, metric, detail
        super().__init__(f"magi2 shadow: {op} provider {provider!r} is outside the contract "
                         f"({metric}): {detail}")


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


def configure(rate: float, *, raise_on_mismatch: bool = False, seed: int | None = None) -> None:
    """Set the sampled fraction for the process (0 turns shadowing off)."""
    global ACTIVE, _rate, _raise
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"shadow rate must be in [0, 1]; got {rate}")
    with _lock:
        _rate, _raise = float(rate), bool(raise_on_mismatch)
        if seed is not None:
            _rng.seed(seed)
        ACTIVE = _rate > 0.0


@contextmanager
def shadow(rate: float = 1.0, *, raise_on_mismatch: bool = False, seed: int | None = None) -> Iterator[None]:
    """Shadow-verify ``rate`` of the op calls inside the block; the previous setting is restored after."""
    previous = (_rate, _raise)
    configure(rate, raise_on_mismatch=raise_on_mismatch, seed=seed)
    try:
        yield
    finally:
        configure(previous[0], raise_on_mismatch=previous[1])


def stats() -> ShadowStats:
    """A snapshot of the counters."""
    with _lock:
        return ShadowStats(_stats.observed, _stats.sampled, _stats.compared, _stats.mismatches,
                           _stats.skipped_reference, _stats.errors,
                           {k: dict(v) for k, v in _stats.by_provider.items()})


def reset_stats() -> None:
    global _stats
    with _lock:
        _stats = ShadowStats()


def _provider_name(op: OpName, kernel: Any) -> str:
    from magi2_core.registry import get_registry

    for p in get_registry().providers(op):
        impl, _ = p.load()
        if impl is kernel:
            return p.name
    return "?"


def _reference_kernel(op: OpName) -> Any:
    from magi2_core.registry import get_registry

    p = get_registry().provider(op, REFERENCE)
    if p is None:
        raise RuntimeError(f"{op}: no reference provider is installed to shadow against")
    kernel, error = p.load()
    if error is not None:
        raise RuntimeError(error)
    return kernel


def _rerun(op: OpName, kernel: Any, call: Any) -> Any:
    """Call ``kernel`` (a provider kernel) with the validated call's arguments, as the op does."""
    if op == "attention":
        return kernel(call.q, call.k, call.v, call.cu_seqlens_q, call.cu_seqlens_k, max_seqlen_q=call.max_seqlen_q,
                      max_seqlen_k=call.max_seqlen_k, softmax_scale=call.softmax_scale, softcap=call.softcap,
                      sinks=call.sinks, sink_rescale=call.sink_rescale, deterministic=call.deterministic,
                      return_lse=call.return_lse)
    if op == "moe_route":
        return kernel(call.x, call.router_weight, call.bias, top_k=call.top_k, route_scale=call.route_scale)
    if op == "moe_experts":
        return kernel(call.x, call.probs, call.idx, call.w_gate, call.w_up, call.w_down)
    return kernel(call.x, call.weight, eps=call.eps, modality_sizes=call.modality_sizes, out_dtype=call.out_dtype)


def _judge(op: OpName, call: Any, out: Any, ref: Any) -> list[acc.Acceptance]:
    if op == "attention":
        results = [acc.accept_attention(out[0], ref[0])]
        if call.return_lse and out[1] is not None and ref[1] is not None:
            results.append(acc.accept_lse(out[1], ref[1], call.q.dtype))
        return results
    if op == "moe_route":
        return [acc.accept_moe_route(out[0], out[1], ref[0], ref[1])]
    if op == "moe_experts":
        return [acc.accept_moe_experts(out, ref, call.w_gate.shape[2])]
    return [acc.accept_rmsnorm(out, ref)]


def observe(op: OpName, kernel: Any, call: Any, out: Any) -> None:
    """Called by the ops after an eager kernel call while shadowing is on: maybe re-run and compare.

    ``call`` is the op contract's validated call (``AttentionCall``, ``RMSNormCall``...), ``out`` what
    the kernel returned. Runs under ``torch.no_grad``; never modifies ``out``.
    """
    if getattr(_local, "busy", False):
        return
    with _lock:
        _stats.observed += 1
        sampled = _rng.random() < _rate
    if not sampled:
        return
    name = _provider_name(op, kernel)
    key = f"{op}:{name}"
    if name == REFERENCE:
        with _lock:
            _stats.skipped_reference += 1
        return
    with _lock:
        _stats.bump(key, "sampled")
    _local.busy = True
    try:
        with torch.no_grad():
            ref = _rerun(op, _reference_kernel(op), call)
            verdicts = _judge(op, call, out, ref)
    except Exception as exc:  # the shadow must never take the serving call down with it
        with _lock:
            _stats.bump(key, "errors")
        warnings.warn(f"magi2 shadow: could not verify {op} provider {name!r}: {type(exc).__name__}: {exc}",
                      ShadowMismatchWarning, stacklevel=3)
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
    if _raise:
        raise ShadowMismatchError(op, name, bad.metric, bad.detail)
    warnings.warn(f"magi2 shadow: {op} provider {name!r} is outside the contract ({bad.metric}): {bad.detail}",
                  ShadowMismatchWarning, stacklevel=3)


def _from_config() -> None:
    configure(config.get("MAGI2_SHADOW"), raise_on_mismatch=config.get("MAGI2_SHADOW_RAISE"))


config.on_reload(_from_config)
_from_config()
