"""Stand-in for vllm-omni 0.30.0 ``vllm_omni/diffusion/models/magi2/layers.py``.

``ModalityDispatcher`` (stable sort of the tokens by modality, host-side group sizes) and
``MultiModalityRMSNorm`` (flat FP32 delta-scale weight, FP32 math, one cast) with upstream's
constructor and forward signatures. The grouped linear, Fourier embedding and mHC helpers are left out.
"""

from __future__ import annotations

import torch
from torch import nn


class ModalityDispatcher:
    def __init__(self, modality_mapping: torch.Tensor, num_modalities: int) -> None:
        self.modality_mapping = modality_mapping
        self.num_modalities = num_modalities
        self.permute_mapping = torch.sort(modality_mapping, stable=True).indices
        self.inv_permute_mapping = torch.empty_like(self.permute_mapping)
        self.inv_permute_mapping[self.permute_mapping] = torch.arange(modality_mapping.numel())
        counts = torch.bincount(modality_mapping.long(), minlength=num_modalities)
        self.group_size = counts.to(torch.int32)
        self.group_size_cpu = [int(n) for n in counts.tolist()]

    def dispatch(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return list(tensor.split(self.group_size_cpu))

    @staticmethod
    def undispatch(*groups: torch.Tensor) -> torch.Tensor:
        return torch.cat(groups)

    def permute(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor[self.permute_mapping]

    def inverse_permute(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor[self.inv_permute_mapping]


class MultiModalityRMSNorm(nn.Module):
    def __init__(
        self,
        dim: int,
        *,
        eps: float = 1e-6,
        num_modality: int = 1,
        num_patterns: int = 1,
        out_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.dim, self.eps, self.num_modality, self.num_patterns, self.out_dtype = (
            dim,
            eps,
            num_modality,
            num_patterns,
            out_dtype,
        )
        self.weight = nn.Parameter(torch.zeros(num_modality * num_patterns * dim, dtype=torch.float32, device=device))

    def forward(self, tensor: torch.Tensor, modality_dispatcher: ModalityDispatcher | None = None) -> torch.Tensor:
        x = tensor.float()
        x = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        scale = self.weight.view(self.num_modality, self.num_patterns, self.dim) + 1.0
        if self.num_modality == 1:
            y = x * scale[0]
        else:
            assert modality_dispatcher is not None, "a multi-modality norm needs the dispatcher"
            parts = modality_dispatcher.dispatch(x)
            y = modality_dispatcher.undispatch(*(p * scale[m] for m, p in enumerate(parts)))
        return y.to(self.out_dtype or tensor.dtype)
