"""Torch-native routed MoE: what a user would write without a fused kernel (the benchmarks' baseline).

Sort the routes by flat expert, gather the activations, run the expert GEMMs, scatter the route
outputs back to route order and sum the top-k in FP32. On sm90+ CUDA the GEMMs are
`torch._grouped_mm`, which only returns BF16: the gate/up projections and the down projection are
rounded to BF16 before SwiGLU7 and before the routing weight, so this path meets the acceptance
tolerance, not the exact rounding schedule. Elsewhere a per-expert loop of FP32 matmuls on the
upcast operands follows the schedule exactly (bf16 products are exact in FP32); it syncs the host
once for the expert counts, which is acceptable for a baseline, never for the fused path.
"""

from __future__ import annotations

import torch
from magi2_backend_triton.moe.align import flat_route_experts
from torch import Tensor

from magi2_core.backend import swiglu7

_MAX_GROUPS = 1000  # torch rejects 1024 groups on sm90 (seen with 12 x 256 experts)


def grouped_mm_syncs_host(num_experts: int) -> bool:
    """The `_grouped_mm` pipeline reads chunk bounds on the host (so it cannot be graph-captured)."""
    return num_experts > _MAX_GROUPS


def _use_grouped_mm(x: Tensor) -> bool:
    return (
        x.device.type == "cuda" and hasattr(torch, "_grouped_mm") and torch.cuda.get_device_capability(x.device)[0] >= 9
    )


def _sort_routes(x: Tensor, probs: Tensor, idx: Tensor, num_experts: int) -> tuple[Tensor, ...]:
    """Routes grouped by flat expert: gathered rows, FP32 weights, counts, and the permutation."""
    num_tokens, heads, _ = x.shape
    rid = flat_route_experts(idx, num_experts // heads)
    _, order = torch.sort(rid, stable=True)
    rows = order // idx.shape[2]  # h*T + t
    a = x[rows % num_tokens, rows // num_tokens]  # [R, d] bf16
    weights = probs.reshape(-1).float()[order]
    counts = torch.zeros(num_experts, dtype=torch.int32, device=x.device)
    counts.index_add_(0, rid, torch.ones_like(rid))
    return a, weights, counts, order


def grouped_mm_moe_experts(
    x: Tensor, probs: Tensor, idx: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor
) -> Tensor:
    """Same contract as `fused_moe_experts`: x [T,Hl,d] bf16 -> y [T,Hl,d] bf16."""
    if x.shape[0] == 0:
        return torch.empty_like(x)
    a, weights, counts, order = _sort_routes(x, probs, idx, w_gate.shape[0])
    if _use_grouped_mm(x):
        r = torch.empty_like(a)
        ends = torch.cumsum(counts, 0, dtype=torch.int32)
        # _grouped_mm takes at most 1024 groups: run chunks of experts (one host sync for the
        # chunk row bounds when there are several, e.g. 12 heads x 256 experts).
        bounds = [0, *ends[_MAX_GROUPS - 1 :: _MAX_GROUPS].tolist()] if grouped_mm_syncs_host(counts.numel()) else [0]
        for c, row0 in enumerate(bounds):
            fs = slice(c * _MAX_GROUPS, (c + 1) * _MAX_GROUPS)
            offs = ends[fs] - row0
            ac = a[row0:]
            g = torch._grouped_mm(ac, w_gate[fs], offs=offs)
            u = torch._grouped_mm(ac, w_up[fs], offs=offs)
            m = swiglu7(g, u).to(torch.bfloat16)
            o = torch._grouped_mm(m, w_down[fs], offs=offs).float() * weights[row0:, None]
            rows = a.shape[0] - row0 if c == len(bounds) - 1 else bounds[c + 1] - row0
            r[row0 : row0 + rows] = o[:rows].to(torch.bfloat16)
    else:
        r = _expert_loop(a, weights, counts, w_gate, w_up, w_down)
    return _sum_topk(r, order, x.shape, idx.shape[2])


def loop_moe_experts(x: Tensor, probs: Tensor, idx: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
    """The exact rounding schedule as a per-expert loop of FP32 matmuls (eager reference path)."""
    if x.shape[0] == 0:
        return torch.empty_like(x)
    a, weights, counts, order = _sort_routes(x, probs, idx, w_gate.shape[0])
    r = _expert_loop(a, weights, counts, w_gate, w_up, w_down)
    return _sum_topk(r, order, x.shape, idx.shape[2])


def _expert_loop(
    a: Tensor,
    weights: Tensor,
    counts: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
) -> Tensor:
    # FP32 matmuls of bf16 values: exact products, FP32 accumulation, as the contract states.
    r = torch.empty_like(a)
    start = 0
    for f, end in enumerate(torch.cumsum(counts, 0).tolist()):
        if end > start:
            af = a[start:end].float()
            mf = swiglu7(af @ w_gate[f].float(), af @ w_up[f].float()).to(torch.bfloat16).float()
            r[start:end] = ((mf @ w_down[f].float()) * weights[start:end, None]).to(torch.bfloat16)
        start = end
    return r


def _sum_topk(r: Tensor, order: Tensor, x_shape: torch.Size, topk: int) -> Tensor:
    num_tokens, heads, d = x_shape
    # Back to route order r = (h*T + t)*K + k, then an FP32 sum over k (in k order) and one cast.
    routed = torch.empty_like(r)
    routed[order] = r
    y = routed.view(heads, num_tokens, topk, d).float().sum(dim=2).to(torch.bfloat16)
    return y.transpose(0, 1).contiguous()
