"""Exact MoE references: top-k routing and the BF16 expert rounding schedule (operators.md §3.2-3.4).

Expert schedule per route (h, t, k) with flat expert f = h·E + idx[h,t,k]:
FP32 gate/up projections -> SwiGLU7 in FP32 -> BF16 intermediate -> FP32 down projection times the
routing weight -> BF16 per route -> sum over k in FP32 -> one cast. Routes are processed expert by
expert, so memory stays at one expert's tokens.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from magi2_core.backend import ScoreFunc, router_scores, swiglu7

if TYPE_CHECKING:
    from magi2_core.backend import ExpertsCall, RouteCall

__all__ = ["exact_moe_experts", "exact_moe_route", "flat_expert_ids", "reference_moe_experts", "reference_moe_route"]


def reference_moe_route(call: RouteCall) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``reference`` routing provider: :func:`exact_moe_route` of the call."""
    return exact_moe_route(
        call.x,
        call.router_weight,
        call.bias,
        top_k=call.top_k,
        route_scale=call.route_scale,
        route_norm=call.route_norm,
        score_func=call.score_func,
    )


def reference_moe_experts(call: ExpertsCall) -> torch.Tensor:
    """The ``reference`` experts provider: :func:`exact_moe_experts` of the call (deterministic either
    way: one fixed-order pass per expert, no atomics)."""
    return exact_moe_experts(call.x, call.probs, call.idx, call.w_gate, call.w_up, call.w_down)


@torch.no_grad()
def exact_moe_route(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    top_k: int,
    route_scale: float,
    route_norm: bool,
    score_func: ScoreFunc,
) -> tuple[torch.Tensor, torch.Tensor]:
    hl = x.shape[1]
    scores = router_scores(x, router_weight, score_func)  # [Hl, T, E] FP32 (or FP64)
    e = scores.shape[2]
    select = scores if bias is None else scores + bias.view(hl, 1, e).to(scores.dtype)
    # A stable descending sort pins equal selection scores to ascending expert id on every device
    # (torch.topk's order of equal values is unspecified and differs between its CPU and CUDA kernels).
    idx = torch.sort(select, dim=-1, descending=True, stable=True).indices[..., :top_k].contiguous()
    probs = torch.gather(scores, -1, idx)
    if route_norm:
        probs = probs / probs.abs().sum(dim=-1, keepdim=True).clamp_min(1e-12)
    return probs * route_scale, idx


def flat_expert_ids(idx: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``[Hl, T, K]`` per-head ids -> flat ids ``h·E + idx`` (head-major expert banks)."""
    offsets = torch.arange(idx.shape[0], device=idx.device, dtype=torch.int64).view(-1, 1, 1) * num_experts
    return idx.long() + offsets


@torch.no_grad()
def exact_moe_experts(
    x: torch.Tensor,
    probs: torch.Tensor,
    idx: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
) -> torch.Tensor:
    t, hl, d = x.shape
    k = probs.shape[2]
    e = w_gate.shape[0] // hl
    flat = flat_expert_ids(idx, e).reshape(-1)  # route r = (h·T + t)·K + k
    acc = torch.promote_types(x.dtype, torch.float32)  # FP32; FP64 inputs give the float64 oracle
    weights = probs.reshape(-1).to(acc)
    rows = x.permute(1, 0, 2).reshape(hl * t, d)  # head-major activations, row = h·T + t
    routes = torch.zeros(flat.numel(), d, dtype=x.dtype, device=x.device)
    order = torch.argsort(flat, stable=True)
    experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
    start = 0
    for f, n in zip(experts.tolist(), counts.tolist(), strict=True):
        r = order[start : start + n]
        start += n
        a = rows[r // k].to(acc)
        mid = swiglu7(a @ w_gate[f].to(acc), a @ w_up[f].to(acc)).to(x.dtype)
        out = (mid.to(acc) @ w_down[f].to(acc)) * weights[r, None]
        routes[r] = out.to(x.dtype)
    y = routes.view(hl, t, k, d).to(acc).sum(dim=2).to(x.dtype)
    return y.permute(1, 0, 2).contiguous()
