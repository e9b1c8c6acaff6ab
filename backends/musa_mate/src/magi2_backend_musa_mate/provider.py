"""The ``mate`` attention provider: MATE's varlen kernel, then the learned sinks in FP32.

MATE runs without sinks and returns the LSE; the sinks are applied afterwards by the LSE
correction of operators.md §2.3 with the FP32 rescale (promote ``o``, multiply by the FP32 scale, cast
once), as vllm-omni #7307 does on MUSA. Native MATE sinks are never used: the sink logits stay FP32
and the result is the one every other provider is checked against.

The correction is :func:`magi2_core.sinks.sink_correction` (torch ops, runs wherever torch_musa
does). ``MAGI2_MATE_SINK_CORRECTION=triton`` switches to the fused Triton kernel of
magi2-backend-triton, which has been validated on CUDA only; it is opt-in until it has run on an
MTT S5000 (Triton-MUSA provides its own libdevice).

Nothing here imports MATE, torch_musa or torchada at module import: ``check`` (called by the
resolver for MUSA problems only) and the first call do, through :mod:`.mate_abi`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import torch

from magi2_backend_musa_mate.mate_abi import MateVarlen, load_mate_varlen, requested_backend
from magi2_core import config
from magi2_core.problem import Feature, Problem
from magi2_core.provider import SinkRescale
from magi2_core.resolution import Reason, ReasonCode
from magi2_core.sinks import sink_correction

__all__ = ["SINK_CORRECTION_ENV", "MateAttention", "mate_attention"]

SINK_CORRECTION_ENV = "MAGI2_MATE_SINK_CORRECTION"
_SINK_IMPLS = ("torch", "triton")


def _sink_impl() -> str:
    return str(config.get(SINK_CORRECTION_ENV))  # validated by magi2_core.config: torch | triton


def _triton_sink_correction(
    o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, rescale: SinkRescale
) -> tuple[torch.Tensor, torch.Tensor]:
    module = importlib.import_module("magi2_backend_triton.sink_correction")
    new_lse = torch.empty((lse.shape[0], lse.shape[1]), dtype=torch.float32, device=lse.device)
    out = module.triton_sink_correction(o, lse.contiguous(), sinks, rescale=rescale, lse_out=new_lse)
    return out, new_lse


def _correct(
    o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, rescale: SinkRescale
) -> tuple[torch.Tensor, torch.Tensor]:
    impl = _sink_impl()
    if impl == "torch":
        return sink_correction(o, lse, sinks, rescale=rescale)
    if impl == "triton":
        return _triton_sink_correction(o, lse, sinks, rescale)
    raise ValueError(f"{SINK_CORRECTION_ENV}={impl!r} is not one of {', '.join(_SINK_IMPLS)}")


class MateAttention:
    """Kernel object of the ``mate`` provider (see :class:`magi2_core.ops.attention.AttentionKernel`)."""

    def check(self, problem: Problem) -> Sequence[Reason]:
        """Run-time availability: MUSA, torchada/torch_musa/MATE importable, the features this
        MATE generation can serve, and valid ``MAGI2_MATE_BACKEND``/``MAGI2_MATE_SINK_CORRECTION``.
        Independent of sizes (the short-sequence floor is a descriptor rule)."""
        mate = load_mate_varlen()
        if isinstance(mate, str):
            return [Reason(code=ReasonCode.UNAVAILABLE, field="mate", expected="MATE importable on MUSA",
                           actual="unavailable", detail=mate)]
        feats = problem.features
        why = mate.unsupported(
            softcap=Feature.SOFTCAP in feats,
            lse=Feature.LSE in feats or Feature.SINKS in feats,
            deterministic=Feature.DETERMINISTIC in feats,
            override=requested_backend(),
        )
        impl = _sink_impl()
        if impl not in _SINK_IMPLS:
            why.append(f"{SINK_CORRECTION_ENV}={impl!r} is not one of {', '.join(_SINK_IMPLS)}")
        elif impl == "triton" and Feature.SINKS in feats:
            try:
                importlib.import_module("magi2_backend_triton.sink_correction")
            except ImportError as exc:
                why.append(f"{SINK_CORRECTION_ENV}=triton but magi2_backend_triton.sink_correction does not "
                           f"import ({type(exc).__name__}: {exc})")
        return [Reason(code=ReasonCode.CHECK, field="mate", expected="a call this MATE build serves",
                       actual="unsupported", detail=w) for w in why]

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        *,
        max_seqlen_q: int,
        max_seqlen_k: int,
        softmax_scale: float,
        softcap: float,
        sinks: torch.Tensor | None,
        sink_rescale: SinkRescale,
        deterministic: bool,
        return_lse: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        mate = load_mate_varlen()
        if not isinstance(mate, MateVarlen):  # only when called without resolution (check() says this)
            raise RuntimeError(f"the mate attention provider is unavailable: {mate}")
        has_sinks = sinks is not None and sinks.numel() > 0
        o, lse = mate(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
            softmax_scale=softmax_scale, softcap=softcap, deterministic=deterministic,
            return_lse=return_lse or has_sinks, backend=requested_backend(),
        )
        if has_sinks:
            assert sinks is not None and lse is not None
            o, lse = _correct(o, lse, sinks, sink_rescale)
        return o, lse if return_lse else None


mate_attention = MateAttention()
