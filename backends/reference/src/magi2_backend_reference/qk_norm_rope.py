"""Exact ``qk_norm_rope``: the per-head multi-modality norm, the row gather and RoPE in float64, one cast."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from magi2_core.backend import QKNormRopeCall

__all__ = ["reference_qk_norm_rope", "scales_per_row"]


def scales_per_row(call: QKNormRopeCall) -> torch.Tensor:
    """``w[m(t)] + 1`` per row of ``x`` (``[T, D]``), formed in the weight's dtype (a low-precision weight
    rounds ``w + 1`` first, as upstream's module does), then promoted to FP32 or wider."""
    weight, sizes, t = call.weight, call.modality_sizes, call.x.shape[0]
    scale = (weight + 1).to(torch.promote_types(weight.dtype, torch.float32))
    if sizes is None:
        return scale[0].expand(t, -1)
    counts = torch.tensor(list(sizes), device=weight.device)
    return torch.repeat_interleave(scale, counts, dim=0, output_size=t)


@torch.no_grad()
def reference_qk_norm_rope(call: QKNormRopeCall) -> torch.Tensor:
    """The ``reference`` provider: every step in float64, cast once to ``call.out_dtype``."""
    x = call.x.double()
    n = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + call.eps)
    n = n * scales_per_row(call).double().unsqueeze(1)
    if call.index is not None:
        n = n.index_select(0, call.index.long())
    half = call.rope.shape[1] // 2
    rope = call.rope.double()
    sin, cos = rope[:, None, :half], rope[:, None, half:]
    lo, hi = n[..., :half], n[..., half : 2 * half]
    rotated = torch.cat((lo * cos - hi * sin, hi * cos + lo * sin), dim=-1)
    return torch.cat((rotated, n[..., 2 * half :]), dim=-1).to(call.out_dtype)
