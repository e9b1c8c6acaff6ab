"""vllm-omni's packed-attention entry point, served by :func:`magi2_core.attention`.

vllm-omni 0.30.0 exchanges heads for tokens (Ulysses) itself, then calls one packed varlen kernel
per rank and adds the sink to the softmax afterwards. These functions take that place: the kernel
and the sink correction become one :func:`magi2_core.attention` call, whose sink correction is FP32
(promote, rescale, cast once) where upstream casts the rescale factor to the activation dtype first.
"""

from __future__ import annotations

from typing import Protocol

import torch

from magi2_core import config, ops

__all__ = ["VarlenLike", "packed_attention_with_sink", "varlen_attention_with_sink"]


def varlen_attention_with_sink(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softcap: float = -1.0,
    sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """Packed non-causal attention with sink logits: ``q [Tq, Hq, D]`` -> ``o [Tq, Hq, D]``.

    ``cu_seqlens_*``: int32 prefix sums (on the GPU in serving), ``max_seqlen_*``: host ints, so the
    call needs no host sync. ``softcap <= 0`` disables the cap (vllm-omni passes -1.0). ``sink``:
    ``[num_sink, Hq]`` logits whose values are zero vectors, taken in FP32; an empty one is no sink.
    The softmax scale is ``D ** -0.5`` and ``MAGI2_DETERMINISTIC=1`` asks for a deterministic
    kernel, as in vllm-omni.
    """
    sinks = None if sink is None or sink.numel() == 0 else sink.float()
    return ops.attention(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        softcap=softcap,
        sinks=sinks,
        deterministic=bool(config.get("MAGI2_DETERMINISTIC")),
    )


class VarlenLike(Protocol):
    """vllm-omni's ``VarlenHandler``: packed-sequence metadata with defaults filled in by ``resolved``."""

    def resolved(self, q_tokens: int, k_tokens: int) -> tuple[torch.Tensor, torch.Tensor, int, int]: ...


def packed_attention_with_sink(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    varlen: VarlenLike,
    *,
    softcap: float = -1.0,
    sink: torch.Tensor | None = None,
) -> torch.Tensor:
    """Drop-in for ``vllm_omni.diffusion.models.magi2.attention.packed_attention_with_sink`` (0.30.x).

    Same arguments: one rank's heads after the Ulysses exchange and the handler's prefix sums, moved
    to q's device as int32 as upstream does; the handler derives missing max lengths as upstream
    does (a host read-back only when they were not given).
    """
    cu_q, cu_k, max_q, max_k = varlen.resolved(q.shape[0], k.shape[0])
    return varlen_attention_with_sink(
        q,
        k,
        v,
        cu_seqlens_q=cu_q.to(device=q.device, dtype=torch.int32),
        cu_seqlens_k=cu_k.to(device=q.device, dtype=torch.int32),
        max_seqlen_q=max_q,
        max_seqlen_k=max_k,
        softcap=softcap,
        sink=sink,
    )
