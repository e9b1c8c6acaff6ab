"""Exact ``qk_norm_rope``: the per-head multi-modality norm, the row gather and RoPE in float64, one cast."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from magi2_backend_reference.rmsnorm import broadcast_scale

if TYPE_CHECKING:
    from magi2_core.backend import QKNormRopeCall

__all__ = ["reference_qk_norm_rope", "scales_per_row"]


def scales_per_row(call: QKNormRopeCall) -> torch.Tensor:
    """``w[m(t)] + 1`` shaped ``[T, 1, D]`` to scale x's rows (the RMSNorm reference's
    :func:`broadcast_scale` with one pattern that broadcasts over the heads)."""
    w = call.weight
    return broadcast_scale(call.x, w.view(w.shape[0], 1, w.shape[1]), call.modality_sizes)


@torch.no_grad()
def reference_qk_norm_rope(call: QKNormRopeCall) -> torch.Tensor:
    """The ``reference`` provider: every step in float64, cast once to ``call.out_dtype``."""
    x = call.x.double()
    n = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + call.eps)
    n = n * scales_per_row(call).double()
    if call.index is not None:
        n = n.index_select(0, call.index.long())
    half = call.rope.shape[1] // 2
    rope = call.rope.double()
    sin, cos = rope[:, None, :half], rope[:, None, half:]
    lo, hi = n[..., :half], n[..., half : 2 * half]
    rotated = torch.cat((lo * cos - hi * sin, hi * cos + lo * sin), dim=-1)
    return torch.cat((rotated, n[..., 2 * half :]), dim=-1).to(call.out_dtype)
