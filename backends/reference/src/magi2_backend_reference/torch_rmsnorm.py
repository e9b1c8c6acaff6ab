"""RMSNorm through ``F.rms_norm`` on the FP32 input (no affine), then ``(w + 1)`` and one cast.

This is the composite of vllm-omni #7286; on CUDA it uses torch's fused rms_norm kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from magi2_backend_reference.rmsnorm import broadcast_scale

__all__ = ["torch_rmsnorm"]


def torch_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    modality_sizes: Sequence[int] | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    n = F.rms_norm(x.float(), (x.shape[-1],), None, eps)
    return (n * broadcast_scale(x, weight, modality_sizes)).to(out_dtype)
