"""Stand-in for vllm-omni 0.30.0 ``vllm_omni/diffusion/models/magi2/modeling_magi2.py``.

What matters to the plugin, as upstream has it: the layer classes are imported BY NAME at import
time (so only this module's attributes decide what the model builds), the modules that own the
swapped operators sit at upstream's attribute paths (hence upstream's checkpoint names), and
``load_weights`` slices MoE tensors through ``ep_slice`` after an ``isinstance`` check on this
module's ``Magi2MultiHeadMoE`` and copies the EMA bias into ``expert_bias`` unless
``MAGI2_ROUTER_BIAS_SOURCE=main``. Left out: every linear layer, the adapters' embeddings, RoPE,
mHC mixing and the forward passes (the tests chain the swapped operators themselves).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
from torch import nn

from .attention import Magi2PackedAttentionKernel, VarlenHandler
from .configuration_magi2 import Magi2PreviewConfig
from .layers import ModalityDispatcher, MultiModalityRMSNorm
from .mh_moe import Magi2MultiHeadMoE, Magi2MultiHeadMoEConfig

__all__ = ["Magi2PreviewTransformer", "ModalityDispatcher", "VarlenHandler"]


class Magi2Attention(nn.Module):
    def __init__(self, config: Magi2PreviewConfig, *, num_modality: int) -> None:
        super().__init__()
        self.pre_norm = MultiModalityRMSNorm(config.hidden_size, num_modality=num_modality)
        self.sinks = nn.Parameter(torch.empty(config.attention_sink_tokens, config.num_heads_q, dtype=torch.float32))
        self.q_norm = MultiModalityRMSNorm(config.head_dim, num_modality=num_modality, out_dtype=torch.float32)
        self.k_norm = MultiModalityRMSNorm(config.head_dim, num_modality=num_modality, out_dtype=torch.float32)
        # upstream wraps this kernel in vllm-omni's Attention layer (custom_attention=...)
        self.packed_attention = Magi2PackedAttentionKernel(config.attention_softcap)


class Magi2MLP(nn.Module):
    def __init__(self, config: Magi2PreviewConfig, *, num_modality: int) -> None:
        super().__init__()
        self.pre_norm = MultiModalityRMSNorm(config.hidden_size, num_modality=num_modality)


class Magi2MultiHeadMoELayer(nn.Module):
    def __init__(self, config: Magi2PreviewConfig) -> None:
        super().__init__()
        moe = config.moe
        self.pre_norm = MultiModalityRMSNorm(config.hidden_size, num_modality=3)
        self.moe_mlp = Magi2MultiHeadMoE(
            Magi2MultiHeadMoEConfig(
                hidden_size=config.hidden_size,
                num_heads=moe.num_heads,
                num_experts=moe.num_experts,
                top_k=moe.top_k,
                expert_intermediate_size=moe.expert_intermediate_size,
                params_dtype=config.params_dtype,
                score_func=moe.score_function,
                route_norm=moe.normalize_routing_weights,
                route_scale=moe.routing_scale,
            )
        )


class Magi2TransformerLayer(nn.Module):
    def __init__(self, config: Magi2PreviewConfig, layer_index: int) -> None:
        super().__init__()
        num_modality = 3 if layer_index in config.multimodal_layers else 1
        self.attention = Magi2Attention(config, num_modality=num_modality)
        self.mlp: nn.Module = (
            Magi2MultiHeadMoELayer(config)
            if layer_index in config.moe.layers
            else Magi2MLP(config, num_modality=num_modality)
        )
        self.mhc_norm = MultiModalityRMSNorm(config.virtual_width, num_modality=num_modality, out_dtype=torch.float32)


class Magi2TransformerBlock(nn.Module):
    def __init__(self, config: Magi2PreviewConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Magi2TransformerLayer(config, i) for i in range(config.num_layers))


class Magi2PostAdapter(nn.Module):
    def __init__(self, config: Magi2PreviewConfig) -> None:
        super().__init__()
        self.final_norm_video = MultiModalityRMSNorm(config.virtual_width)
        self.final_norm_audio = MultiModalityRMSNorm(config.virtual_width)


class Magi2PreviewTransformer(nn.Module):
    _EP_SHARDED_SUFFIXES = tuple(
        f".moe_mlp.{n}" for n in ("gate", "W_gate", "W_up", "W_down", "router.expert_bias", "router.expert_bias_ema")
    )

    def __init__(self, config: Magi2PreviewConfig | None = None) -> None:
        super().__init__()
        self.config = config or Magi2PreviewConfig()
        self.post_adapter = Magi2PostAdapter(self.config)
        self.block = Magi2TransformerBlock(self.config)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        targets = self.state_dict(keep_vars=True)
        modules = dict(self.named_modules())
        done: set[str] = set()
        for raw_name, tensor in weights:
            name = raw_name.removeprefix("transformer.")
            if name not in targets:
                raise ValueError(f"unexpected checkpoint weight {raw_name!r}")
            owner = modules.get(name.split(".moe_mlp.", 1)[0] + ".moe_mlp") if ".moe_mlp." in name else None
            if isinstance(owner, Magi2MultiHeadMoE) and name.endswith(self._EP_SHARDED_SUFFIXES):
                tensor = owner.ep_slice(tensor)
            if tuple(tensor.shape) != tuple(targets[name].shape):
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != {tuple(targets[name].shape)}")
            with torch.no_grad():
                targets[name].copy_(tensor)
            done.add(name)
        if (os.environ.get("MAGI2_ROUTER_BIAS_SOURCE") or "ema").strip().lower() != "main":
            for module_name, module in self.named_modules():
                if isinstance(module, Magi2MultiHeadMoE):
                    with torch.no_grad():
                        module.router.expert_bias.copy_(module.router.expert_bias_ema)
                    done.add(f"{module_name}.router.expert_bias")
        missing = set(targets) - done
        if missing:
            raise ValueError(f"checkpoint is missing {sorted(missing)[:8]}")
        return done
