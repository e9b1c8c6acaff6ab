"""vllm-omni's mHC hyper-connections, served by :func:`magi2_core.mhc_pre` and :func:`magi2_core.mhc_mix`.

vllm-omni 0.30.0's ``Magi2TransformerLayer`` runs each branch's mHC through three methods:
``_branch_logits`` (norm and projection), ``_branch_input`` (sigmoid coefficients, weighted stream
sum) and ``_connect`` (post coefficients, Sinkhorn, the mix). :class:`MHCLayerMethods` holds their
replacements, which the plugin sets on that class: ``_branch_logits`` runs ``mhc_pre`` once and
returns ``(branch_input, post, residual)`` in place of upstream's three logit tensors (the layer
passes that tuple on, across its compile regions, to the other two methods without reading it);
``_branch_input`` returns the first, ``_connect`` runs ``mhc_mix`` with the other two. They read the
layer's own parameters (``mhc_norm.weight``, ``mhc_phi_fused_<branch>``, ``mhc_alpha_*``,
``mhc_bias_*``) and settings, so the checkpoint and the parameters are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from magi2_core import ops
from magi2_core.errors import InvalidValueError
from magi2_core.integrations.vllm_omni.norm import ModalityDispatcherLike

__all__ = ["METHODS", "MHCLayerMethods"]

METHODS = ("_branch_logits", "_branch_input", "_connect")


class MHCLayerMethods:
    """The three mHC methods of vllm-omni's ``Magi2TransformerLayer`` (``self`` is that layer)."""

    def _branch_logits(
        self: Any, streams: torch.Tensor, branch: str, dispatcher: ModalityDispatcherLike
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        norm, handler = self.mhc_norm, self.mhc_handler
        sizes: Sequence[int] | None = None
        if norm.num_modality > 1:
            if dispatcher is None:
                raise InvalidValueError(
                    "Magi2TransformerLayer",
                    "dispatcher",
                    f"a ModalityDispatcher for this {norm.num_modality}-modality mHC norm",
                    "None",
                )
            sizes = list(dispatcher.group_size_cpu)
        return ops.mhc_pre(
            streams,
            norm.weight,
            getattr(self, f"mhc_phi_fused_{branch}"),
            getattr(self, f"mhc_alpha_pre_{branch}"),
            getattr(self, f"mhc_alpha_post_{branch}"),
            getattr(self, f"mhc_alpha_res_{branch}"),
            getattr(self, f"mhc_bias_pre_{branch}"),
            getattr(self, f"mhc_bias_post_{branch}"),
            getattr(self, f"mhc_bias_res_{branch}"),
            eps=norm.eps,
            modality_sizes=sizes,
            sinkhorn_iterations=handler.sinkhorn_iterations,
            sinkhorn_eps=handler.sinkhorn_epsilon,
        )

    def _branch_input(
        self: Any, streams: torch.Tensor, branch: str, logits: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        return logits[0]

    def _connect(
        self: Any,
        streams: torch.Tensor,
        output: torch.Tensor,
        branch: str,
        logits: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        return ops.mhc_mix(streams, output, logits[1], logits[2])
