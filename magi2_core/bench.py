"""Dispatch-overhead measurement: what the registry adds to a direct provider call (CPU)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import magi2_core as m2
from magi2_core.contracts import attention as attn_c
from magi2_core.contracts import rmsnorm as norm_c
from magi2_core.ops import dispatcher

__all__ = ["dispatch_overhead"]


def _per_call_us(fn: Callable[[], object], iters: int, repeats: int = 5) -> float:
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter_ns() - t0) / iters / 1e3)
    return statistics.median(samples)


def dispatch_overhead(iters: int = 20000) -> list[dict[str, Any]]:
    """Per op: cached resolve, the public call, the direct provider call, and their difference (µs)."""
    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []
    disp = dispatcher()

    x = torch.randn(4, 8)
    w = torch.randn(1, 1, 8)
    nc = norm_c.validate(x, w, eps=1e-6, modality_sizes=None, out_dtype=None, compiling=False)
    nk = disp.kernel("rmsnorm", nc.raw, norm_c.KEY_FIELDS, norm_c.problem_from_raw, None)
    rows.append(
        _row(
            "rmsnorm",
            lambda: disp.kernel("rmsnorm", nc.raw, norm_c.KEY_FIELDS, norm_c.problem_from_raw, None),
            lambda: m2.rmsnorm(x, w),
            lambda: nk(nc.x, nc.weight, eps=1e-6, modality_sizes=None, out_dtype=x.dtype),
            iters,
        )
    )

    q = torch.randn(4, 2, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    ac = attn_c.validate(
        q,
        q,
        q,
        cu,
        cu,
        max_seqlen_q=4,
        max_seqlen_k=4,
        softmax_scale=None,
        softcap=0.0,
        sinks=None,
        sink_rescale="fp32",
        deterministic=False,
        return_lse=False,
        compiling=False,
    )
    ak = disp.kernel("attention", ac.raw, attn_c.KEY_FIELDS, attn_c.problem_from_raw, None)
    rows.append(
        _row(
            "attention",
            lambda: disp.kernel("attention", ac.raw, attn_c.KEY_FIELDS, attn_c.problem_from_raw, None),
            lambda: m2.attention(q, q, q, cu, cu, max_seqlen_q=4, max_seqlen_k=4),
            lambda: ak(
                q,
                q,
                q,
                ac.cu_seqlens_q,
                ac.cu_seqlens_k,
                max_seqlen_q=4,
                max_seqlen_k=4,
                softmax_scale=ac.softmax_scale,
                softcap=0.0,
                sinks=None,
                sink_rescale="fp32",
                deterministic=False,
                return_lse=False,
            ),
            iters // 4,
        )
    )
    return rows


def _row(
    op: str, resolve: Callable[[], object], public: Callable[[], object], direct: Callable[[], object], iters: int
) -> dict[str, Any]:
    r = _per_call_us(resolve, iters)
    p = _per_call_us(public, iters)
    d = _per_call_us(direct, iters)
    return {"op": op, "resolve_us": r, "public_us": p, "direct_us": d, "added_us": p - d}
