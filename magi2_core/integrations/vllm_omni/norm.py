"""vllm-omni's multi-modality RMSNorm layer, served by :func:`magi2_core.rmsnorm`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from magi2_core import ops
from magi2_core.errors import InvalidValueError

__all__ = ["ModalityDispatcherLike", "MultiModalityRMSNorm"]


class ModalityDispatcherLike(Protocol):
    """The part of vllm-omni's ``ModalityDispatcher`` the norm reads: host-side group sizes.

    Tokens arrive permuted so that each modality is one contiguous group, in modality order.
    """

    @property
    def group_size_cpu(self) -> Sequence[int]: ...


class MultiModalityRMSNorm(nn.Module):
    """Checkpoint-compatible with vllm-omni 0.30.0's ``layers.MultiModalityRMSNorm``.

    ``weight``: flat ``[num_modality · num_patterns · dim]`` delta scales (zeros = identity),
    modality-major; output ``x·rsqrt(mean(x²)+eps)·(w[m]+1)`` computed in FP32 and cast once to
    ``out_dtype`` (default: the input's dtype). ``dtype`` is the parameter dtype (upstream: FP32).
    """

    def __init__(
        self,
        dim: int,
        *,
        eps: float = 1e-6,
        num_modality: int = 1,
        num_patterns: int = 1,
        out_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.num_modality = num_modality
        self.num_patterns = num_patterns
        self.out_dtype = out_dtype
        self.weight = nn.Parameter(torch.zeros(num_patterns * dim * num_modality, dtype=dtype, device=device))

    def forward(self, tensor: torch.Tensor, modality_dispatcher: ModalityDispatcherLike | None = None) -> torch.Tensor:
        """``tensor [T, ..., D]`` (``[T, ..., P, D]`` when P > 1); a single-modality norm ignores the
        dispatcher, as upstream does; a multi-modality norm needs it."""
        sizes: Sequence[int] | None = None
        if self.num_modality > 1:
            if modality_dispatcher is None:
                raise InvalidValueError(
                    "MultiModalityRMSNorm",
                    "modality_dispatcher",
                    f"a ModalityDispatcher for this {self.num_modality}-modality norm",
                    "None",
                )
            sizes = list(modality_dispatcher.group_size_cpu)
        weight = self.weight.view(self.num_modality, self.num_patterns, self.dim)
        return ops.rmsnorm(tensor, weight, eps=self.eps, modality_sizes=sizes, out_dtype=self.out_dtype)

    def extra_repr(self) -> str:
        return (
            f"{self.dim}, eps={self.eps}, num_modality={self.num_modality}, num_patterns={self.num_patterns}, "
            f"out_dtype={self.out_dtype}"
        )
