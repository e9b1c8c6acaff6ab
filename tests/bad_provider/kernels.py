"""Kernels of the bad example backend, built on the reference kernels plus one bug each."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from magi2_backend_reference.attention import exact_attention, reference_attention
from magi2_backend_reference.rmsnorm import reference_rmsnorm_fp32

from magi2_core.model.problem import Problem
from magi2_core.ops.attention import AttentionCall
from magi2_core.ops.rmsnorm import RMSNormCall
from magi2_core.reasons import Reason, ReasonCode


def bad_attention(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
    o, lse = exact_attention(
        call.q,
        call.k,
        call.v,
        call.cu_seqlens_q,
        call.cu_seqlens_k,
        softmax_scale=call.softmax_scale,
        softcap=call.softcap,
        sinks=None,  # bug 1: sinks dropped
        sink_rescale=call.sink_rescale,
        return_lse=call.return_lse,
    )
    return o, None if lse is None else lse.t().contiguous()  # bug 2: [Tq, Hq]


def bad_rmsnorm(call: RMSNormCall) -> torch.Tensor:
    first = call.weight[:1]  # bug: one modality's scale for every token
    return reference_rmsnorm_fp32(call.x, first, call.eps, None).to(call.out_dtype)


class OverclaimAttention:
    """Correct math; refuses float16 at run time although the descriptor claims it."""

    def check(self, problem: Problem) -> Sequence[Reason]:
        if problem.dtype == "float16":
            return [
                Reason(
                    code=ReasonCode.CHECK,
                    field="dtype",
                    expected="bfloat16 | float32",
                    actual="float16",
                    detail="this build has no fp16 kernels",
                )
            ]
        return []

    def __call__(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        return reference_attention(call)


overclaim_attention = OverclaimAttention()
