"""vllm-omni's mHC hyper-connections, served by :func:`magi2_core.mhc_pre`, :func:`magi2_core.mhc_mix` and
:func:`magi2_core.mhc_mix_pre`.

vllm-omni 0.30.0's ``Magi2TransformerLayer`` runs each branch's mHC through three methods:
``_branch_logits`` (norm and projection), ``_branch_input`` (sigmoid coefficients, weighted stream
sum) and ``_connect`` (post coefficients, Sinkhorn, the mix). :class:`MHCLayerMethods` holds their
replacements, which the plugin sets on that class: ``_branch_logits`` runs ``mhc_pre`` once and
returns ``(branch_input, post, residual)`` in place of upstream's three logit tensors (the layer
passes that tuple on, across its compile regions, to the other two methods without reading it);
``_branch_input`` returns the first, ``_connect`` runs ``mhc_mix`` with the other two. They read the
layer's own parameters (``mhc_norm.weight``, ``mhc_phi_fused_<branch>``, ``mhc_alpha_*``,
``mhc_bias_*``) and settings, so the checkpoint and the parameters are unchanged.

Between the branches, upstream's ``_mlp_input`` runs the attention output, the attention branch's
``_connect`` and the MLP branch's ``_branch_logits`` and ``_branch_input``: the mix, then ``mhc_pre`` of
the streams it has just written. :class:`MHCFusedMethods` replaces it by the same steps with the last
three as one ``mhc_mix_pre`` call (a provider may form the MLP branch's logits while it writes the new
streams). It reads the tuple ``_branch_logits`` returns, so the plugin sets it only over
:class:`MHCLayerMethods`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from magi2_core import ops
from magi2_core.errors import InvalidValueError
from magi2_core.integrations.vllm_omni.norm import ModalityDispatcherLike

__all__ = ["FUSED_METHODS", "METHODS", "MHCFusedMethods", "MHCLayerMethods"]

METHODS = ("_branch_logits", "_branch_input", "_connect")
FUSED_METHODS = ("_mlp_input",)


def _parameters(
    layer: Any, branch: str, dispatcher: ModalityDispatcherLike
) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """The ``mhc_pre`` parameters (after the streams) and options of ``layer``'s ``branch``."""
    norm, handler = layer.mhc_norm, layer.mhc_handler
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
    params = (
        norm.weight,
        getattr(layer, f"mhc_phi_fused_{branch}"),
        getattr(layer, f"mhc_alpha_pre_{branch}"),
        getattr(layer, f"mhc_alpha_post_{branch}"),
        getattr(layer, f"mhc_alpha_res_{branch}"),
        getattr(layer, f"mhc_bias_pre_{branch}"),
        getattr(layer, f"mhc_bias_post_{branch}"),
        getattr(layer, f"mhc_bias_res_{branch}"),
    )
    options = {
        "eps": norm.eps,
        "modality_sizes": sizes,
        "sinkhorn_iterations": handler.sinkhorn_iterations,
        "sinkhorn_eps": handler.sinkhorn_epsilon,
    }
    return params, options


class MHCLayerMethods:
    """The three mHC methods of vllm-omni's ``Magi2TransformerLayer`` (``self`` is that layer)."""

    def _branch_logits(
        self: Any, streams: torch.Tensor, branch: str, dispatcher: ModalityDispatcherLike
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        params, options = _parameters(self, branch, dispatcher)
        return ops.mhc_pre(streams, *params, **options)

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


class MHCFusedMethods:
    """``Magi2TransformerLayer._mlp_input`` with the mix and the MLP branch's mHC input as one call."""

    def _mlp_input(
        self: Any,
        streams: torch.Tensor,
        attention: torch.Tensor,
        gates: torch.Tensor,
        attention_logits: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        modality_dispatcher: ModalityDispatcherLike,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
        attention_output = self.attention.output(attention, gates, modality_dispatcher)
        params, options = _parameters(self, "mlp", modality_dispatcher)
        streams, branch_input, post, residual = ops.mhc_mix_pre(
            streams, attention_output, attention_logits[1], attention_logits[2], *params, **options
        )
        return streams, (branch_input, post, residual), branch_input
