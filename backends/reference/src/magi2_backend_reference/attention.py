"""Exact packed varlen attention with learned sinks, on any device (operators.md §2.2-2.3).

Scores, softmax and the P·V product are FP32 (FP64 for FP64 inputs: the demo's oracle uses that);
the output is rounded once to q's dtype. Scores that overflow FP32 (|q·k·scale| beyond 3.4e38) give
NaN rows, never a finite wrong answer. Memory stays
bounded for long sequences: queries are processed in chunks so that one chunk's score matrix holds
at most ``MAX_SCORE_ELEMENTS`` values (a 32k-token segment fits in a few hundred MB).
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

import torch

from magi2_core.backend import SinkRescale, sink_correction

if TYPE_CHECKING:
    from magi2_core.backend import AttentionCall

__all__ = ["MAX_SCORE_ELEMENTS", "exact_attention", "reference_attention"]

MAX_SCORE_ELEMENTS = 1 << 24


def _segment(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, softcap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One segment: q [Lq, Hq, D], k/v [Lk, Hkv, D] (FP32) -> o [Lq, Hq, D], lse [Hq, Lq]."""
    lq, hq, d = q.shape
    lk, hkv, _ = k.shape
    g = hq // hkv
    o = q.new_zeros(lq, hq, d)
    lse = q.new_full((hq, lq), float("-inf"))
    if lq == 0 or lk == 0:
        return o, lse
    kh = k.permute(1, 0, 2)  # [Hkv, Lk, D]
    vh = v.permute(1, 0, 2)
    chunk = max(1, MAX_SCORE_ELEMENTS // max(1, lk * hq))
    for start in range(0, lq, chunk):
        qc = q[start : start + chunk]  # [c, Hq, D]
        c = qc.shape[0]
        qh = qc.permute(1, 0, 2).reshape(hkv, g * c, d)  # q head h = kvh * g + j (repeat-interleave groups)
        s = torch.bmm(qh, kh.transpose(1, 2)) * scale  # [Hkv, g·c, Lk]
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        m = torch.logsumexp(s, dim=-1, keepdim=True)  # finite: Lk > 0
        # Softmax as max-shifted exponentials divided by their row sum (not exp(s - LSE)): a row of
        # equal scores then weighs every key by exactly 1/Lk, and a single key by exactly 1.0.
        p = torch.exp(s - s.amax(dim=-1, keepdim=True))
        oc = torch.bmm(p, vh) / p.sum(dim=-1, keepdim=True)  # [Hkv, g·c, D]
        o[start : start + c] = oc.reshape(hq, c, d).permute(1, 0, 2)
        lse[:, start : start + c] = m.reshape(hq, c)
    return o, lse


def reference_attention(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The ``reference`` provider: :func:`exact_attention` of the call (deterministic either way; the
    max lengths only bound what the prefix sums say)."""
    return exact_attention(
        call.q,
        call.k,
        call.v,
        call.cu_seqlens_q,
        call.cu_seqlens_k,
        softmax_scale=call.softmax_scale,
        softcap=call.softcap,
        sinks=call.sinks,
        sink_rescale=call.sink_rescale,
        return_lse=call.return_lse,
    )


@torch.no_grad()
def exact_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    softmax_scale: float,
    softcap: float,
    sinks: torch.Tensor | None,
    sink_rescale: SinkRescale,
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The contract's attention on explicit inputs (normalised as :class:`AttentionCall` says):
    ``(o [Tq, Hq, D] in q's dtype, lse [Hq, Tq] FP32 or None)``."""
    tq, hq, d = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    o32 = q.new_zeros(tq, hq, d, dtype=acc)
    lse = q.new_full((hq, tq), float("-inf"), dtype=acc)
    bq = cu_seqlens_q.tolist()
    bk = cu_seqlens_k.tolist()
    for (q0, q1), (k0, k1) in zip(pairwise(bq), pairwise(bk), strict=True):
        if q1 == q0:
            continue
        o_seg, lse_seg = _segment(q[q0:q1].to(acc), k[k0:k1].to(acc), v[k0:k1].to(acc), softmax_scale, softcap)
        o32[q0:q1] = o_seg
        lse[:, q0:q1] = lse_seg
    if sinks is None:
        return o32.to(q.dtype), lse.float() if return_lse else None
    if sink_rescale == "fp32":
        out, new_lse = sink_correction(o32, lse, sinks, rescale="fp32", out_dtype=q.dtype)
    else:  # as on CUDA: the kernel's output is rounded first, then scaled in the activation dtype
        out, new_lse = sink_correction(o32.to(q.dtype), lse, sinks, rescale="activation")
    return out, new_lse.float() if return_lse else None
