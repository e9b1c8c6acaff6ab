"""What a provider's kernel object looks like to the core.

A capability descriptor names its kernel object as ``impl = "module:attribute"``. The registry
imports it only when the provider is considered for a call. The object is callable with the
operator's provider signature (below) and may define ``check(problem)`` for run-time availability
(an optional import, a compute capability) and cross-field limits. ``check`` must depend only on the
problem's device type, dtypes and features and on the environment, never on sizes: its answer is
cached per problem bucket. Size limits belong in the descriptor (``ranges``, ``rules``).

Inputs reaching a provider are validated and normalised by the op contract: prefix sums are int32 on
q's device, ``max_seqlen_*`` are Python ints, ``softcap`` is ``max(softcap, 0.0)``, ``sinks`` is
``None`` or FP32 ``[S, Hq]`` with ``S >= 1``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

import torch

from magi2_core.problem import Problem
from magi2_core.resolution import Reason

__all__ = [
    "AttentionKernel",
    "Checkable",
    "MoEExpertsKernel",
    "MoEWeightPreparer",
    "MoERouteKernel",
    "RMSNormKernel",
    "SinkRescale",
]

SinkRescale = Literal["fp32", "activation"]


@runtime_checkable
class Checkable(Protocol):
    def check(self, problem: Problem) -> Sequence[Reason]:
        """Reasons this provider cannot serve ``problem`` here (empty: it can)."""
        ...


class AttentionKernel(Protocol):
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
        """Return ``(o [Tq, Hq, D] in q.dtype, lse [Hq, Tq] FP32 or None)``; sinks already applied."""
        ...


class MoERouteKernel(Protocol):
    def __call__(
        self,
        x: torch.Tensor,
        router_weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        top_k: int,
        route_scale: float,
        route_norm: bool,
        score_func: Literal["sigmoid", "softmax"],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(probs [Hl, T, K] FP32, idx [Hl, T, K] int64)``. ``route_norm=False`` and
        ``score_func="softmax"`` reach only providers that declare ``route_no_norm`` / ``route_softmax``."""
        ...


class MoEExpertsKernel(Protocol):
    def __call__(
        self,
        x: torch.Tensor,
        probs: torch.Tensor,
        idx: torch.Tensor,
        w_gate: torch.Tensor,
        w_up: torch.Tensor,
        w_down: torch.Tensor,
        *,
        deterministic: bool = False,
    ) -> torch.Tensor:
        """Return ``y [T, Hl, d]`` in x.dtype.

        ``deterministic=True`` is passed (as a keyword, and only when asked) to providers that declare
        the ``deterministic`` feature: the output must then be bitwise repeatable.
        """
        ...


@runtime_checkable
class MoEWeightPreparer(Protocol):
    """Optional on a ``moe_experts`` kernel object: lay one layer's weights out once, at load time.

    Returns ``(layout, tensors)`` for a layout named in :mod:`magi2_core.moe_weights`. Without this
    method the weights stay in checkpoint layout (the identity preparation). The kernel then receives
    the checkpoint-layout views of the prepared tensors and may recognise its own layout from their
    strides; a provider must serve any layout correctly, even one it did not prepare.
    """

    def prepare_weights(
        self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
    ) -> tuple[str, tuple[torch.Tensor, ...]]: ...


class RMSNormKernel(Protocol):
    def __call__(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        *,
        eps: float,
        modality_sizes: Sequence[int] | None,
        out_dtype: torch.dtype,
    ) -> torch.Tensor:
        """Return the normalised, scaled ``x`` cast once to ``out_dtype``."""
        ...
