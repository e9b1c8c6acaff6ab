"""mHC in vllm-omni 0.30.0's native torch form (FP32 norm and projection, its casts, einsums): the
``torch_native`` provider, and the upstream formula that the contract's rounding points describe."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from magi2_backend_reference.mhc import sinkhorn

if TYPE_CHECKING:
    from magi2_core.backend import MHCMixCall, MHCPreCall

__all__ = ["torch_mhc_mix", "torch_mhc_pre"]


@torch.no_grad()
def torch_mhc_pre(call: MHCPreCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = call.streams
    t, n, d = x.shape
    flat = x.float().reshape(t, n * d)
    normed = flat * torch.rsqrt(flat.square().mean(dim=-1, keepdim=True) + call.eps)
    scale = call.norm_weight.reshape(-1, n * d) + 1.0
    sizes = [t] if call.modality_sizes is None else list(call.modality_sizes)
    normed = torch.cat([part * scale[m] for m, part in enumerate(torch.split(normed, sizes, dim=0))], dim=0)
    l_pre, l_post, l_res = torch.split(normed @ call.phi, [n, n, n * n], dim=-1)
    s = 1.0 / math.sqrt(n * d)
    c = torch.sigmoid(call.alpha_pre * s * l_pre + call.bias_pre.unsqueeze(0))
    h = torch.einsum("tn,tnc->tc", c.to(x.dtype), x)
    post = 2.0 * torch.sigmoid(call.alpha_post * s * l_post + call.bias_post.unsqueeze(0))
    res = sinkhorn(
        call.alpha_res * s * l_res.reshape(t, n, n) + call.bias_res.unsqueeze(0),
        call.sinkhorn_iterations,
        call.sinkhorn_eps,
    )
    return h, post.to(call.out_dtype), res.to(call.out_dtype)


@torch.no_grad()
def torch_mhc_mix(call: MHCMixCall) -> torch.Tensor:
    x, post, res = call.streams, call.post, call.residual
    if post.dtype != x.dtype or res.dtype != x.dtype:  # coefficients kept wider: their values, FP32 products
        wide = torch.promote_types(x.dtype, torch.float32)
        mixed = torch.einsum("tij,tjc->tic", res.to(wide), x.to(wide)).to(x.dtype)
        return mixed + (post.to(wide).unsqueeze(-1) * call.branch_output.to(wide).unsqueeze(1)).to(x.dtype)
    branch = torch.einsum("tn,tc->tnc", post, call.branch_output)
    mixed = torch.einsum("tij,tjc->tic", res, x)
    return mixed + branch
