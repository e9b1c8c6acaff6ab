"""Kernels of the example backend: plain torch, so the test suite can run them on the CPU."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from magi2_core.ops.attention import AttentionCall
    from magi2_core.ops.rmsnorm import RMSNormCall

CALLS: list[str] = []


def example_rmsnorm(call: RMSNormCall) -> torch.Tensor:
    CALLS.append("rmsnorm")
    x, weight = call.x, call.weight
    sizes = list(call.modality_sizes) if call.modality_sizes is not None else [x.shape[0]]
    xf = x.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + call.eps)
    chunks = []
    for m, part in enumerate(n.split(sizes)):
        scale = (weight[m] + 1).float()  # [P, D]
        chunks.append(part * (scale if x.dim() > 2 else scale[0]))
    return torch.cat(chunks).to(call.out_dtype)


def fpga_attention(call: AttentionCall) -> None:
    raise RuntimeError("the example FPGA has no hardware; it exists to be resolved, not run")
