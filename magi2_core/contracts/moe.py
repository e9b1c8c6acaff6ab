"""MoE math shared by the providers: router scores and SwiGLU7 (operators.md §3).

Validation, keys and the public calls live in the op specs (:mod:`magi2_core.ops.moe_route`,
:mod:`magi2_core.ops.moe_experts`); this module holds what every provider must compute the same way.

``x [T, Hl, d]``: Hl heads are hidden-state slices, each with its own bank of E experts.
Routing: ``router_weight`` FP32 ``[Hl·E, d]`` head-major, ``bias`` FP32 ``[Hl·E]`` (selection only);
scores are ``sigmoid`` (the release) or ``softmax`` over a head's experts, computed by
:func:`router_scores`; the ids are the ``top_k`` largest ``score + bias`` in descending order, equal
values in ascending expert id (NaN ranks highest, ``-inf`` lowest: a ``-inf`` bias selects its expert
only in a head with fewer than ``top_k`` others; ids distinct, in ``[0, E)``; the conformance inputs of
:func:`magi2_core.testing.specials.route_specials`); the weights are the selected unbiased scores,
L1-normalised unless ``route_norm=False``, times ``route_scale``.
Experts: ``w_gate``/``w_up`` ``[Hl·E, d, I]``, ``w_down`` ``[Hl·E, I, d]``; probs FP32 ``[Hl, T, K]``,
idx ``[Hl, T, K]`` per-head expert ids in ``[0, E)``.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["SCORE_FUNCS", "SWIGLU_ALPHA", "SWIGLU_LIMIT", "ScoreFunc", "router_scores", "swiglu7"]

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0
ScoreFunc = Literal["sigmoid", "softmax"]
SCORE_FUNCS: tuple[ScoreFunc, ...] = ("sigmoid", "softmax")


def swiglu7(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """SwiGLU with clamps, in FP32 (or wider): ``min(g,7)·σ(1.702·min(g,7))·(clamp(u,±7)+1)``."""
    acc = torch.promote_types(g.dtype, torch.float32)
    g = g.to(acc).clamp(max=SWIGLU_LIMIT)
    u = u.to(acc).clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
    return g * torch.sigmoid(SWIGLU_ALPHA * g) * (u + 1.0)


def router_scores(x: torch.Tensor, router_weight: torch.Tensor, score_func: ScoreFunc) -> torch.Tensor:
    """``[Hl, T, E]`` routing scores in FP32 (FP64 for FP64 inputs): one batched GEMM over the heads, then
    ``sigmoid`` or ``softmax`` over each head's experts.

    Every provider that promises the reference's expert ids uses this one function: the GEMM's
    summation order (and so the last bit of a near-tie) is whatever the BLAS picks for these exact
    operands, so the scores are computed once, the same way, and only what follows is fused.
    """
    hl, d = x.shape[1], x.shape[2]
    e = router_weight.shape[0] // hl
    acc = torch.promote_types(x.dtype, torch.float32)
    w = router_weight.view(hl, e, d).to(acc)
    logits = torch.bmm(x.to(acc).permute(1, 0, 2), w.transpose(1, 2))
    return torch.sigmoid(logits) if score_func == "sigmoid" else torch.softmax(logits, dim=-1)
