"""``torch.nn.Module`` wrappers for users who want layers rather than functions.

Each layer holds its parameters in MAGI-2's checkpoint layout and calls the public ops, so the same
resolution, overrides and explanations apply. :class:`HeadRoutedMoE` prepares its expert weights for
the serving provider once (at construction, after ``load_state_dict`` and after a device or dtype
move); its gate/up parameters are then views of the prepared storage, so in-place updates reach the
kernel and no second copy exists. Its router weight is routed with as it is (the fused router splits
it for its tensor cores in registers, so there is no derived copy that a write could leave stale).
Its ``state_dict`` stays in checkpoint layout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from magi2_core import ops
from magi2_core.contracts.moe_weights import CHECKPOINT, PreparedMoEWeights

__all__ = ["MultiModalityRMSNorm", "PackedAttentionWithSinks", "HeadRoutedMoE"]


class MultiModalityRMSNorm(nn.Module):
    """FP32 RMSNorm with modality-major delta scales ``w[m, p] + 1`` (zero-initialised = identity)."""

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        num_modality: int = 1,
        num_patterns: int = 1,
        out_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim, self.eps, self.num_modality, self.num_patterns, self.out_dtype = (
            dim,
            eps,
            num_modality,
            num_patterns,
            out_dtype,
        )
        self.weight = nn.Parameter(torch.zeros(num_modality * num_patterns * dim, dtype=torch.float32))

    def forward(self, x: torch.Tensor, modality_sizes: Sequence[int] | None = None) -> torch.Tensor:
        w = self.weight.view(self.num_modality, self.num_patterns, self.dim)
        return ops.rmsnorm(x, w, eps=self.eps, modality_sizes=modality_sizes, out_dtype=self.out_dtype)


class PackedAttentionWithSinks(nn.Module):
    """Packed varlen attention with FP32 learned sink logits ``[sink_tokens, num_heads]``."""

    def __init__(self, num_heads: int, sink_tokens: int = 1, softcap: float = -1.0) -> None:
        super().__init__()
        self.softcap = softcap
        self.sinks = nn.Parameter(torch.zeros(sink_tokens, num_heads, dtype=torch.float32))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int | None = None,
        max_seqlen_k: int | None = None,
    ) -> torch.Tensor:
        return ops.attention(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            softcap=self.softcap,
            sinks=self.sinks,
        )


class HeadRoutedMoE(nn.Module):
    """MAGI-2's multi-head MoE: ``x [T, H·d]`` viewed ``[T, H, d]``, each head routed over its own experts."""

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        num_experts: int,
        intermediate: int,
        top_k: int = 6,
        route_scale: float = 4.9,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        f = num_heads * num_experts
        self.num_heads, self.head_dim, self.top_k, self.route_scale = num_heads, head_dim, top_k, route_scale
        self.router = nn.Parameter(torch.empty(f, head_dim, dtype=torch.float32))
        self.register_buffer("expert_bias", torch.zeros(f, dtype=torch.float32))
        self.w_gate = nn.Parameter(torch.empty(f, head_dim, intermediate, dtype=dtype))
        self.w_up = nn.Parameter(torch.empty(f, head_dim, intermediate, dtype=dtype))
        self.w_down = nn.Parameter(torch.empty(f, intermediate, head_dim, dtype=dtype))
        self._prepared: PreparedMoEWeights | None = None
        self._prepared_for: tuple[nn.Parameter, ...] = ()
        self.reset_parameters()
        self.register_load_state_dict_post_hook(_prepare_after_load)  # type: ignore[no-untyped-call]
        self.register_state_dict_post_hook(_checkpoint_layout)  # type: ignore[no-untyped-call]

    def reset_parameters(self) -> None:
        nn.init.normal_(self.router, std=self.head_dim**-0.5)
        for w in (self.w_gate, self.w_up):
            nn.init.normal_(w, std=self.head_dim**-0.5)
        nn.init.normal_(self.w_down, std=self.w_down.shape[1] ** -0.5)
        self.prepare_weights()

    def prepare_weights(self) -> PreparedMoEWeights:
        """Lay the expert weights out for the provider that serves them, in place of the parameters.

        Runs at construction, after ``load_state_dict`` and after ``.to()``/``.cuda()``; call it again
        after replacing a weight parameter by hand (in-place updates need no call).
        """
        prepared = ops.prepare_moe_weights(self.w_gate, self.w_up, self.w_down)
        if prepared.layout != CHECKPOINT:
            # Re-seat the parameters (same objects, so optimizers keep them) on the prepared storage:
            # views of it, so the old tensors are freed and no second copy of gate/up stays alive.
            self.w_gate.data, self.w_up.data, self.w_down.data = prepared.w_gate, prepared.w_up, prepared.w_down
        self._prepared, self._prepared_for = prepared, (self.w_gate, self.w_up, self.w_down)
        return prepared

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> HeadRoutedMoE:
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self.prepare_weights()  # a move copies the views to plain tensors: lay them out again
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = x.reshape(x.shape[0], self.num_heads, self.head_dim)
        bias = self.get_buffer("expert_bias")
        probs, idx = ops.moe_route(heads, self.router, bias, top_k=self.top_k, route_scale=self.route_scale)
        was = self._prepared_for
        if self._prepared is not None and was[0] is self.w_gate and was[1] is self.w_up and was[2] is self.w_down:
            y = ops.moe_experts(heads, probs, idx, self._prepared)
        else:  # a parameter object was replaced by hand since the last preparation
            y = ops.moe_experts(heads, probs, idx, self.w_gate, self.w_up, self.w_down)
        return y.reshape(x.shape)


def _prepare_after_load(module: nn.Module, _incompatible: object) -> None:
    assert isinstance(module, HeadRoutedMoE)
    module.prepare_weights()  # a plain load copied into the prepared views; assign=True replaced them


def _checkpoint_layout(module: nn.Module, state: dict[str, Any], prefix: str, _meta: Mapping[str, Any]) -> None:
    # The gate/up parameters may be strided views of a packed bank: a checkpoint holds plain tensors.
    for name in ("w_gate", "w_up", "w_down"):
        t = state.get(prefix + name)
        if isinstance(t, torch.Tensor) and not t.is_contiguous():
            state[prefix + name] = t.contiguous()
