"""Exact multi-modality RMSNorm: FP32 normalisation, modality-major ``(w + 1)`` scales (operators.md §4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from magi2_core.backend import RMSNormCall

__all__ = ["broadcast_scale", "reference_rmsnorm", "reference_rmsnorm_fp32"]


def broadcast_scale(x: torch.Tensor, weight: torch.Tensor, modality_sizes: Sequence[int] | None) -> torch.Tensor:
    """FP32 scales ``w[m(t)] + 1`` shaped to broadcast against ``x`` (``[T, D]`` or ``[T, ..., P, D]``).

    ``w + 1`` is formed in the weight's dtype, then promoted: a low-precision weight rounds first,
    as upstream does. ``weight`` is ``[M, P, D]``.
    """
    tokens = x.shape[0]
    scale = (weight + 1).to(torch.promote_types(weight.dtype, torch.float32))
    if modality_sizes is None:
        per_token = scale[0].expand(tokens, *scale.shape[1:])
    else:
        sizes = torch.tensor(list(modality_sizes), device=weight.device)
        per_token = torch.repeat_interleave(scale, sizes, dim=0, output_size=tokens)
    if x.dim() == 2:
        return per_token.reshape(tokens, x.shape[-1])
    return per_token.reshape([tokens] + [1] * (x.dim() - 3) + list(per_token.shape[1:]))


@torch.no_grad()
def reference_rmsnorm_fp32(
    x: torch.Tensor, weight: torch.Tensor, eps: float, modality_sizes: Sequence[int] | None
) -> torch.Tensor:
    """The pre-cast FP32 result: ``x·rsqrt(mean(x²) + eps)·(w[m] + 1)``. ``weight`` is ``[M, P, D]``."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))  # FP32 (FP64 inputs: the demo's oracle)
    ms = xf.square().mean(dim=-1, keepdim=True)
    n = xf * torch.rsqrt(ms + eps)
    if xf.shape[-1] == 0:  # an empty width: the empty result, as upstream (amax below has no empty identity)
        return n * broadcast_scale(x, weight, modality_sizes).to(xf.dtype)
    # A finite row whose squares overflow FP32 (|x| above ~1e19) would come out as zeros: normalise it
    # by its largest magnitude first (the same value in exact arithmetic). Other rows keep their bits;
    # both branches are computed so that no host sync is needed.
    peak = xf.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(xf.dtype).tiny)
    xs = xf / peak
    rescaled = xs * torch.rsqrt(xs.square().mean(dim=-1, keepdim=True) + eps / peak.square())
    n = torch.where(torch.isinf(ms) & torch.isfinite(peak), rescaled, n)  # rows with inf/NaN inputs: as before
    return n * broadcast_scale(x, weight, modality_sizes).to(xf.dtype)


def reference_rmsnorm(call: RMSNormCall) -> torch.Tensor:
    """The ``reference`` provider: :func:`reference_rmsnorm_fp32` of the call, cast once to its ``out_dtype``."""
    return reference_rmsnorm_fp32(call.x, call.weight, call.eps, call.modality_sizes).to(call.out_dtype)
