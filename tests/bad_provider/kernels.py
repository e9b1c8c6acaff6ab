"""Kernels of the bad example backend, built on the reference kernels plus one bug each."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from magi2_backend_reference.attention import reference_attention
from magi2_backend_reference.rmsnorm import reference_rmsnorm

from magi2_core.problem import Problem
from magi2_core.provider import SinkRescale
from magi2_core.resolution import Reason, ReasonCode


def bad_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *,
    max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, softcap: float, sinks: torch.Tensor | None,
    sink_rescale: SinkRescale, deterministic: bool, return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    o, lse = reference_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
        softmax_scale=softmax_scale, softcap=softcap, sinks=None,  # bug 1: sinks dropped
        sink_rescale=sink_rescale, deterministic=deterministic, return_lse=return_lse,
    )
    return o, None if lse is None else lse.t().contiguous()  # bug 2: [Tq, Hq]


def bad_rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, *, eps: float, modality_sizes: Sequence[int] | None, out_dtype: torch.dtype
) -> torch.Tensor:
    first = weight[:1]  # bug: one modality's scale for every token
    return reference_rmsnorm(x, first, eps=eps, modality_sizes=None, out_dtype=out_dtype)


class OverclaimAttention:
    """Correct math; refuses float16 at run time although the descriptor claims it."""

    def check(self, problem: Problem) -> Sequence[Reason]:
        if problem.dtype == "float16":
            return [Reason(code=ReasonCode.CHECK, field="dtype", expected="bfloat16 | float32", actual="float16",
                           detail="this build has no fp16 kernels")]
        return []

    def __call__(self, *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor | None]:
        return reference_attention(*args, **kwargs)  # type: ignore[arg-type]


overclaim_attention = OverclaimAttention()
