"""vllm-omni's attention output, its gather and gate served by :func:`magi2_core.output_gate`.

vllm-omni 0.30.0's ``Magi2Attention.output`` moves the attention result into modality order
(``permute``: an ``index_select`` of rows), multiplies each head by ``sigmoid`` of its gate logit, casts
to the checkpoint dtype and runs the output projection. :class:`AttentionOutputMethods` holds the
replacement the plugin sets on that class: one ``output_gate`` call (the rows read in place, in FP32,
one cast), then upstream's own projection. It reads the layer's own modules, so the checkpoint is
unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from magi2_core import ops

__all__ = ["METHODS", "AttentionOutputMethods"]

METHODS = ("output",)


class AttentionOutputMethods:
    """The replacement of vllm-omni's ``Magi2Attention.output`` (``self`` is that module)."""

    def output(self: Any, attention: torch.Tensor, gates: torch.Tensor, modality_dispatcher: Any) -> torch.Tensor:
        # attention is [T, H, D] (upstream broadcasts it against the [T, H, 1] gates), read as it is
        gated = ops.output_gate(
            attention, gates, index=modality_dispatcher.permute_mapping, out_dtype=self.config.params_dtype
        )
        return self.linear_proj(gated.view(-1, self.q_size), modality_dispatcher)  # type: ignore[no-any-return]
