"""The ``mate`` attention provider: MATE's varlen kernel, then the learned sinks in FP32.

MATE runs without sinks and returns the LSE; the sinks are applied afterwards by the LSE
correction of operators.md §2.3 with the FP32 rescale (promote ``o``, multiply by the FP32 scale, cast
once), as vllm-omni #7307 does on MUSA. Native MATE sinks are never used: the sink logits stay FP32
and the result is the one every other provider is checked against.

The correction is the core's choice for MUSA (:func:`magi2_core.sink_correction.choice.sink_correction_for`):
the torch one (runs wherever torch_musa does) unless ``MAGI2_MATE_SINK_CORRECTION=triton`` picks the
fused Triton kernel that magi2-backend-triton contributes, which has been validated on CUDA only; it
is opt-in until it has run on an MTT S5000 (Triton-MUSA provides its own libdevice).

Nothing here imports MATE, torch_musa or torchada at module import: ``check`` (called by the
resolver for MUSA problems only) and the first call do, through :mod:`.mate_abi`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from magi2_backend_musa_mate.mate_abi import MateVarlen, load_mate_varlen, requested_backend
from magi2_backend_musa_mate.platform import DEVICE_TYPE
from magi2_backend_musa_mate.settings import MATE_SINK_CORRECTION
from magi2_core.backend import ConfigError, Feature, Problem, Reason, ReasonCode, sink_correction_for

if TYPE_CHECKING:
    from magi2_core.backend import AttentionCall

__all__ = ["SINK_CORRECTION_ENV", "MateAttention", "mate_attention"]

SINK_CORRECTION_ENV = MATE_SINK_CORRECTION.name  # MAGI2_MATE_SINK_CORRECTION: torch (default) | triton


class MateAttention:
    """Kernel object of the ``mate`` provider (see :class:`magi2_core.ops.attention.AttentionKernel`)."""

    def check(self, problem: Problem) -> Sequence[Reason]:
        """Run-time availability: MUSA, torchada/torch_musa/MATE importable, the features this
        MATE generation can serve, and valid ``MAGI2_MATE_BACKEND``/``MAGI2_MATE_SINK_CORRECTION``.
        Independent of sizes (the short-sequence floor is a descriptor rule)."""
        mate = load_mate_varlen()
        if isinstance(mate, str):
            return [
                Reason(
                    code=ReasonCode.UNAVAILABLE,
                    field="mate",
                    expected="MATE importable on MUSA",
                    actual="unavailable",
                    detail=mate,
                )
            ]
        feats = problem.features
        why = mate.unsupported(
            softcap=Feature.SOFTCAP in feats,
            lse=Feature.LSE in feats or Feature.SINKS in feats,
            deterministic=Feature.DETERMINISTIC in feats,
            override=requested_backend(),
        )
        if Feature.SINKS in feats:
            try:
                sink_correction_for(DEVICE_TYPE)
            except ConfigError as exc:  # the correction that MAGI2_MATE_SINK_CORRECTION names is not there
                why.append(str(exc))
        return [
            Reason(
                code=ReasonCode.CHECK,
                field="mate",
                expected="a call this MATE build serves",
                actual="unsupported",
                detail=w,
            )
            for w in why
        ]

    def __call__(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        mate = load_mate_varlen()
        if not isinstance(mate, MateVarlen):  # only when called without resolution (check() says this)
            raise RuntimeError(f"the mate attention provider is unavailable: {mate}")
        sinks = call.sinks
        has_sinks = sinks is not None and sinks.numel() > 0
        o, lse = mate(call, return_lse=call.return_lse or has_sinks, backend=requested_backend())
        if has_sinks:
            assert sinks is not None and lse is not None
            return sink_correction_for(DEVICE_TYPE).apply(
                o, lse, sinks, rescale=call.sink_rescale, return_lse=call.return_lse
            )
        return o, lse if call.return_lse else None


mate_attention = MateAttention()
