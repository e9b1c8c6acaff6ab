"""Stand-in for vllm-omni 0.30.0 ``vllm_omni/diffusion/models/magi2/attention.py``.

The call chain the plugin patches into: ``Magi2PackedAttentionKernel.forward`` ->
``ulysses_packed_attention_with_sink`` -> ``packed_attention_with_sink`` (looked up in this module
at call time), with upstream's names and signatures, and ``VarlenHandler``. The attention itself is
upstream's CPU path restated: per segment, FP32 scores, the sink logits appended to the softmax.
Left out: the FlashAttention path, RoPE helpers and the Ulysses exchange (one rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vllm_omni.diffusion.attention.backends.abstract import AttentionMetadata

from .parallel import Magi2ParallelGroup, get_magi2_ulysses_group


@dataclass(frozen=True)
class VarlenHandler:
    cu_seqlens_q: torch.Tensor | None
    cu_seqlens_k: torch.Tensor | None
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None

    def resolved(self, q_tokens: int, k_tokens: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        cu_q = self.cu_seqlens_q if self.cu_seqlens_q is not None else torch.tensor([0, q_tokens], dtype=torch.int32)
        cu_k = self.cu_seqlens_k if self.cu_seqlens_k is not None else torch.tensor([0, k_tokens], dtype=torch.int32)
        max_q = self.max_seqlen_q if self.max_seqlen_q is not None else int(cu_q.diff().max())
        max_k = self.max_seqlen_k if self.max_seqlen_k is not None else int(cu_k.diff().max())
        return cu_q, cu_k, max_q, max_k


def torch_varlen_attention_with_sink(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    softcap: float = -1.0,
    sink: torch.Tensor | None = None,
) -> torch.Tensor:
    out = torch.empty_like(q)
    group = q.shape[1] // k.shape[1]
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(bounds_q) - 1):
        qs, ks = slice(bounds_q[b], bounds_q[b + 1]), slice(bounds_k[b], bounds_k[b + 1])
        qf = q[qs].float()
        kf = k[ks].float().repeat_interleave(group, dim=1)
        vf = v[ks].float().repeat_interleave(group, dim=1)
        logits = torch.einsum("qhd,khd->hqk", qf, kf) / q.shape[-1] ** 0.5
        if softcap > 0:
            logits = softcap * torch.tanh(logits / softcap)
        n_keys = logits.shape[-1]
        if sink is not None and sink.numel():
            extra = sink.float().t()[:, None, :].expand(-1, logits.shape[1], -1)
            logits = torch.cat((logits, extra), dim=-1)
        p = logits.softmax(-1)[..., :n_keys]
        out[qs] = torch.einsum("hqk,khd->qhd", p, vf).to(q.dtype)
    return out


def packed_attention_with_sink(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    varlen: VarlenHandler,
    *,
    softcap: float = -1.0,
    sink: torch.Tensor | None = None,
) -> torch.Tensor:
    cu_q, cu_k, _, _ = varlen.resolved(q.shape[0], k.shape[0])
    return torch_varlen_attention_with_sink(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, softcap=softcap, sink=sink)


def ulysses_packed_attention_with_sink(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    varlen: VarlenHandler,
    split_sizes: list[int] | torch.Tensor,
    *,
    softcap: float = -1.0,
    sink: torch.Tensor | None = None,
    group: Magi2ParallelGroup | None = None,
) -> torch.Tensor:
    group = group or get_magi2_ulysses_group()
    assert group.world_size == 1, "the stand-in has no Ulysses exchange"
    return packed_attention_with_sink(q, k, v, varlen, softcap=softcap, sink=sink)


class Magi2PackedAttentionKernel(nn.Module):
    def __init__(self, softcap: float) -> None:
        super().__init__()
        self.softcap = softcap

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_metadata: AttentionMetadata | None = None,
    ) -> torch.Tensor:
        assert attn_metadata is not None
        extra = attn_metadata.extra
        return ulysses_packed_attention_with_sink(
            query,
            key,
            value,
            extra["magi2_varlen"],
            extra["magi2_split_sizes"],
            softcap=self.softcap,
            sink=extra.get("magi2_sink"),
        )
