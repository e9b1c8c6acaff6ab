"""Exact mHC (operators.md §5): float64 arithmetic, rounded only where vllm-omni 0.30.0's native path
materialises a value (the pre coefficients, the branch input, post / residual, the two mix terms)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from magi2_core.backend import MHCMixCall, MHCPreCall

__all__ = ["mhc_logits", "reference_mhc_mix", "reference_mhc_pre", "sinkhorn"]


def sinkhorn(logits: torch.Tensor, iterations: int, eps: float) -> torch.Tensor:
    """Sinkhorn-Knopp over the last two dims: ``exp(l - max)``, then column and row normalisation
    ``iterations`` times (each sum plus ``eps``). A NaN anywhere in a token's matrix spreads to all of it
    through the max, as upstream's ``amax``."""
    m = torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))
    for _ in range(iterations):
        m = m / (m.sum(dim=-2, keepdim=True) + eps)
        m = m / (m.sum(dim=-1, keepdim=True) + eps)
    return m


def mhc_logits(
    streams: torch.Tensor,
    norm_weight: torch.Tensor,
    phi: torch.Tensor,
    eps: float,
    modality_sizes: Sequence[int] | None,
) -> torch.Tensor:
    """``rmsnorm(streams.view(T, n·D)) @ phi`` in float64: ``[T, 2n + n²]`` (``norm_weight``: ``[M·n·D]`` or
    ``[M, n·D]``)."""
    t, n, d = streams.shape
    x = streams.double().reshape(t, n * d)
    normed = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + eps)
    scale = (norm_weight.reshape(-1, n * d) + 1).double()  # w + 1 in the FP32 parameter's dtype, as upstream
    if modality_sizes is None:
        per_token = scale[0].expand(t, -1)
    else:
        sizes = torch.tensor(list(modality_sizes), device=scale.device)
        per_token = torch.repeat_interleave(scale, sizes, dim=0, output_size=t)
    return (normed * per_token) @ phi.double()


@torch.no_grad()
def reference_mhc_pre(call: MHCPreCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``reference`` provider of ``mhc_pre``."""
    x = call.streams
    t, n, d = x.shape
    logits = mhc_logits(x, call.norm_weight, call.phi, call.eps, call.modality_sizes)
    s = 1.0 / math.sqrt(n * d)
    l_pre, l_post, l_res = torch.split(logits, [n, n, n * n], dim=-1)
    c = torch.sigmoid(call.alpha_pre.double().reshape(()) * s * l_pre + call.bias_pre.double())
    c = c.to(x.dtype).double()  # upstream casts the coefficients to the streams' dtype before the sum
    h = (c.unsqueeze(-1) * x.double()).sum(dim=1).to(x.dtype)
    post = 2.0 * torch.sigmoid(call.alpha_post.double().reshape(()) * s * l_post + call.bias_post.double())
    res = sinkhorn(
        call.alpha_res.double().reshape(()) * s * l_res.reshape(t, n, n) + call.bias_res.double(),
        call.sinkhorn_iterations,
        call.sinkhorn_eps,
    )
    return h, post.to(call.out_dtype), res.to(call.out_dtype)


@torch.no_grad()
def reference_mhc_mix(call: MHCMixCall) -> torch.Tensor:
    """The ``reference`` provider of ``mhc_mix``: both terms materialised in the streams' dtype, then summed."""
    x = call.streams
    mixed = torch.einsum("tij,tjc->tic", call.residual.double(), x.double()).to(x.dtype)
    branch = (call.post.double().unsqueeze(-1) * call.branch_output.double().unsqueeze(1)).to(x.dtype)
    return (mixed.double() + branch.double()).to(x.dtype)
