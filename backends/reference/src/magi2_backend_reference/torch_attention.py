"""Attention through torch's own varlen kernel (``torch.nn.attention.varlen.varlen_attn``, CUDA).

torch >= 2.10 returns the LSE through ``return_aux=AuxRequest(lse=True)`` as ``[Hq, Tq]`` FP32; the
sinks are applied afterwards through the LSE correction that the core chooses for the device
(:func:`magi2_core.sink_correction.choice.sink_correction_for`). No softcap. On torch 2.10 there is no
``scale``/``enable_gqa`` keyword, which the signature check below turns into typed reasons.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch

from magi2_core.backend import (
    CheckedOn,
    Feature,
    Problem,
    Reason,
    ReasonCode,
    VirtualDevice,
    absent_device,
    sink_correction_for,
)

if TYPE_CHECKING:
    from magi2_core.backend import AttentionCall

__all__ = ["TorchVarlenAttention", "torch_varlen_attention"]


class TorchVarlenAttention:
    @cached_property
    def _api(self) -> tuple[Any, Any, frozenset[str]] | str:
        try:
            from torch.nn.attention.varlen import AuxRequest, varlen_attn
        except ImportError as exc:
            return f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn with AuxRequest ({exc})"
        return varlen_attn, AuxRequest, frozenset(inspect.signature(varlen_attn).parameters)

    def check(self, problem: Problem) -> Sequence[Reason]:
        absent = absent_device(problem.device_type)
        if absent:  # before _api: a host without the device never imports varlen (and torch._dynamo)
            return absent
        return self._api_reasons(problem)

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        """For a described device: this host's torch is assumed there (its varlen keywords decide)."""
        return CheckedOn(tuple(self._api_reasons(problem)))

    def _api_reasons(self, problem: Problem) -> list[Reason]:
        api = self._api
        if isinstance(api, str):
            return [
                Reason(
                    code=ReasonCode.UNAVAILABLE,
                    field="torch",
                    expected="torch >= 2.10 varlen_attn",
                    actual=torch.__version__,
                    detail=api,
                )
            ]
        params = api[2]
        out: list[Reason] = []
        if Feature.GQA in problem.features and "enable_gqa" not in params:
            out.append(
                Reason(
                    code=ReasonCode.FEATURE,
                    field="gqa",
                    expected="varlen_attn(enable_gqa=)",
                    actual=f"torch {torch.__version__}",
                )
            )
        if "scale" not in params:
            out.append(
                Reason(
                    code=ReasonCode.CHECK,
                    field="softmax_scale",
                    expected="varlen_attn(scale=)",
                    actual=f"torch {torch.__version__}",
                    detail="needs torch >= 2.12",
                )
            )
        return out

    def __call__(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        api = self._api
        assert not isinstance(api, str), api
        varlen_attn, aux_request, _ = api
        q, k = call.q, call.k
        kwargs: dict[str, Any] = {"return_aux": aux_request(lse=True), "scale": call.softmax_scale}
        if q.shape[1] != k.shape[1]:
            kwargs["enable_gqa"] = True
        o, lse = varlen_attn(
            q, k, call.v, call.cu_seqlens_q, call.cu_seqlens_k, call.max_seqlen_q, call.max_seqlen_k, **kwargs
        )
        if tuple(lse.shape) != (q.shape[1], q.shape[0]):
            raise RuntimeError(
                f"varlen_attn returned LSE {list(lse.shape)}, expected [Hq, Tq] = {[q.shape[1], q.shape[0]]}"
            )
        # FA2 inside torch marks a row with no keys by LSE = +inf; the contract (and FA3, MATE) use -inf,
        # which the sink correction needs (L' = Ls). A finite score row can never give +inf.
        lse = lse.masked_fill(lse == float("inf"), float("-inf"))
        if call.sinks is not None:  # o is varlen_attn's fresh output: the correction may overwrite it
            return sink_correction_for(o.device.type).apply(
                o, lse, call.sinks, rescale=call.sink_rescale, return_lse=call.return_lse
            )
        return o, lse if call.return_lse else None


torch_varlen_attention = TorchVarlenAttention()
