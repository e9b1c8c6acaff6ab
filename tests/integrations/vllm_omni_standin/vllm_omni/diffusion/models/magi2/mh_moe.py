"""Stand-in for vllm-omni 0.30.0 ``vllm_omni/diffusion/models/magi2/mh_moe.py``.

``Magi2MultiHeadMoEConfig`` and ``Magi2MultiHeadMoE`` with upstream's parameter names, shapes and
dtypes, its ``ep_slice`` hook and its ``MAGI2_ROUTER_BIAS_SOURCE`` switch (read from the
environment on every call, as upstream). The experts run as a per-(head, expert) torch loop in the
weights' dtype, as upstream's CPU path does. Left out: the Triton kernel and expert parallelism
(the stand-in's group is always one rank).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .parallel import Magi2ParallelGroup, get_magi2_ep_group


@dataclass(frozen=True)
class Magi2MultiHeadMoEConfig:
    hidden_size: int
    num_heads: int
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    params_dtype: torch.dtype
    score_func: str = "sigmoid"
    route_norm: bool = True
    route_scale: float = 1.0


class Magi2MultiHeadMoE(nn.Module):
    def __init__(self, config: Magi2MultiHeadMoEConfig, *, ep_group: Magi2ParallelGroup | None = None) -> None:
        super().__init__()
        self.config = config
        self.ep_group = ep_group or get_magi2_ep_group()
        assert self.ep_group.world_size == 1, "the stand-in has no expert parallelism"
        self.num_heads, self.num_experts, self.top_k = config.num_heads, config.num_experts, config.top_k
        self.d_head = config.hidden_size // config.num_heads
        self.d_expert = config.expert_intermediate_size
        self.local_num_heads = self.num_heads
        self.local_flatten_num_experts = rows = self.num_heads * self.num_experts
        self.gate = nn.Parameter(torch.empty(rows, self.d_head, dtype=torch.float32))
        self.W_gate = nn.Parameter(torch.empty(rows, self.d_head, self.d_expert, dtype=config.params_dtype))
        self.W_up = nn.Parameter(torch.empty(rows, self.d_head, self.d_expert, dtype=config.params_dtype))
        self.W_down = nn.Parameter(torch.empty(rows, self.d_expert, self.d_head, dtype=config.params_dtype))
        self.router = nn.Module()
        self.router.expert_bias = nn.Parameter(torch.zeros(rows), requires_grad=False)
        self.router.expert_bias_ema = nn.Parameter(torch.zeros(rows), requires_grad=False)

    def ep_slice(self, checkpoint_tensor: torch.Tensor) -> torch.Tensor:
        return checkpoint_tensor  # one rank holds every head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, e, d = self.num_heads, self.num_experts, self.d_head
        xs = x.view(-1, h, d)
        use_main = (os.environ.get("MAGI2_ROUTER_BIAS_SOURCE") or "ema").strip().lower() == "main"
        bias = (self.router.expert_bias if use_main else self.router.expert_bias_ema).view(h, 1, e)
        logits = torch.einsum("thd,hed->hte", xs.float(), self.gate.view(h, e, d).float())
        scores = logits.sigmoid() if self.config.score_func == "sigmoid" else logits.softmax(-1)
        chosen = (scores + bias).topk(self.top_k, dim=-1).indices  # [h, t, k]
        weights = scores.gather(-1, chosen)
        if self.config.route_norm:
            weights = F.normalize(weights, p=1, dim=-1, eps=1e-12)
        weights = weights * self.config.route_scale
        out = torch.zeros_like(xs)
        for head in range(h):
            for expert in range(e):
                tok, slot = (chosen[head] == expert).nonzero(as_tuple=True)
                if tok.numel() == 0:
                    continue
                f = head * e + expert
                xin = xs[tok, head]
                g, u = xin @ self.W_gate[f], xin @ self.W_up[f]
                g32, u32 = g.float().clamp(max=7.0), u.float().clamp(-7.0, 7.0)
                act = (g32 * torch.sigmoid(1.702 * g32) * (u32 + 1.0)).to(g.dtype)
                y = act @ self.W_down[f]
                out[:, head].index_add_(0, tok, y * weights[head, tok, slot, None].to(y.dtype))
        return out.view(-1, h * d)
