"""Stand-in for vllm-omni 0.30.0 ``vllm_omni/diffusion/models/magi2/configuration_magi2.py``.

The architecture fields that size the swapped layers, with upstream's defaults (the released
``sand-ai/MAGI-2-preview``). Generation settings and ``validate()`` are left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Magi2MHCConfig:
    enabled: bool = True
    num_streams: int = 4


@dataclass(frozen=True)
class Magi2MoEConfig:
    num_heads: int = 12
    num_experts: int = 256
    top_k: int = 6
    expert_intermediate_size: int = 1280
    score_function: str = "sigmoid"
    normalize_routing_weights: bool = True
    routing_scale: float = 4.9
    layers: tuple[int, ...] = tuple(range(2, 38))


@dataclass(frozen=True)
class Magi2PreviewConfig:
    num_layers: int = 40
    hidden_size: int = 3072
    head_dim: int = 128
    num_query_groups: int = 24
    multimodal_layers: tuple[int, ...] = (0, 1, 38, 39)
    params_dtype: torch.dtype = torch.bfloat16
    attention_softcap: float = -1.0
    attention_sink_tokens: int = 1
    mhc: Magi2MHCConfig = field(default_factory=Magi2MHCConfig)
    moe: Magi2MoEConfig = field(default_factory=Magi2MoEConfig)

    @property
    def num_heads_q(self) -> int:
        return self.hidden_size // self.head_dim

    @property
    def num_heads_kv(self) -> int:
        return self.num_query_groups

    @property
    def virtual_width(self) -> int:
        return self.mhc.num_streams * self.hidden_size
