"""Dispatch-overhead measurement: what the registry adds to a provider call (CPU).

The added cost is measured against a no-op provider registered in process for the measurement, so
that kernel time (and its cache effects) cannot hide or inflate it: ``public`` is the op call with
``provider=`` naming the no-op, ``direct`` the no-op called by hand, ``added`` their difference
(validation + cached resolution + argument plumbing). ``resolve`` times the cached lookup alone.
"""

from __future__ import annotations

import sys
import timeit
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

import magi2_core as m2
from magi2_core.capability import Capability
from magi2_core.contracts import attention as attn_c
from magi2_core.contracts import rmsnorm as norm_c
from magi2_core.hookspecs import BackendSpec, hookimpl
from magi2_core.ops import dispatcher
from magi2_core.problem import Feature

__all__ = ["dispatch_overhead"]

_NOOP = "magi2_core_bench_noop"


def _noop_attention(q: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
    return q, None


def _noop_rmsnorm(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return x


@contextmanager
def _noop_backend() -> Iterator[None]:
    kernels = types.ModuleType(_NOOP)
    kernels.attention = _noop_attention  # type: ignore[attr-defined]
    kernels.rmsnorm = _noop_rmsnorm  # type: ignore[attr-defined]
    sys.modules[_NOOP] = kernels
    caps = tuple(
        Capability(op=op, name="bench_noop", impl=f"{_NOOP}:{op}", device_types=("cpu",), dtypes=("float32",),
                   features=frozenset(Feature), priority=-1000)
        for op in ("attention", "rmsnorm")
    )  # fmt: skip
    plugin = types.SimpleNamespace(magi2_backend=hookimpl(lambda: BackendSpec(
        name="magi2-bench-noop", version="0", core_api=">=1.0,<2", providers=caps)))
    reg = m2.get_registry()
    reg.register(plugin, name="bench_noop")
    try:
        yield
    finally:
        reg.unregister("bench_noop")
        del sys.modules[_NOOP]


def _per_call_us(fn: Callable[[], object], iters: int) -> float:
    fn()
    return min(timeit.repeat(fn, number=iters, repeat=5)) / iters * 1e6


def dispatch_overhead(iters: int = 20000) -> list[dict[str, Any]]:
    """Per op: cached resolve, the public call and the direct call of a no-op provider (best of 5, µs)."""
    torch.manual_seed(0)
    disp = dispatcher()
    x, w = torch.randn(4, 8), torch.randn(1, 1, 8)
    q = torch.randn(4, 2, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    nc = norm_c.validate(x, w, eps=1e-6, modality_sizes=None, out_dtype=None, compiling=False)
    ac = attn_c.validate(q, q, q, cu, cu, max_seqlen_q=4, max_seqlen_k=4, softmax_scale=None, softcap=0.0,
                         sinks=None, sink_rescale="fp32", deterministic=False, return_lse=False, compiling=False)
    with _noop_backend():
        rows = [
            _row("rmsnorm", iters,
                 resolve=lambda: disp.kernel("rmsnorm", nc.raw, norm_c.KEY_FIELDS, norm_c.problem_from_raw, None),
                 public=lambda: m2.rmsnorm(x, w, provider="bench_noop"),
                 direct=lambda: _noop_rmsnorm(x, w, eps=1e-6, modality_sizes=None, out_dtype=x.dtype)),
            _row("attention", iters,
                 resolve=lambda: disp.kernel("attention", ac.raw, attn_c.KEY_FIELDS, attn_c.problem_from_raw, None),
                 public=lambda: m2.attention(q, q, q, cu, cu, max_seqlen_q=4, max_seqlen_k=4, provider="bench_noop"),
                 direct=lambda: _noop_attention(q, q, q, cu, cu, max_seqlen_q=4, max_seqlen_k=4,
                                                softmax_scale=ac.softmax_scale, softcap=0.0, sinks=None,
                                                sink_rescale="fp32", deterministic=False, return_lse=False)),
        ]  # fmt: skip
    return rows


def _row(op: str, iters: int, *, resolve: Callable[[], object], public: Callable[[], object],
         direct: Callable[[], object]) -> dict[str, Any]:
    r = _per_call_us(resolve, iters)
    p = _per_call_us(public, iters)
    d = _per_call_us(direct, iters)
    return {"op": op, "resolve_us": r, "public_us": p, "direct_us": d, "added_us": p - d}
