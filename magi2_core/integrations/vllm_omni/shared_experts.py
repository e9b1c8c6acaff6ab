"""vllm-omni's shared experts without the concatenation around their SwiGLU7.

vllm-omni 0.30.0's ``Magi2MultiHeadMoELayer._shared_experts`` runs two first GEMMs (the shared expert and
the modality-specific one, each writing interleaved ``(gate, linear)`` column pairs), concatenates their
outputs, applies SwiGLU7 to the ``[T, 2 * (Is + Im)]`` result, splits it back into the two halves, copies
the second contiguous and runs the two second GEMMs. SwiGLU7 acts on each column pair alone and each
half holds whole pairs, so applying it to each half gives the same numbers, bit for bit, with neither the
concatenation nor the copy: :class:`SharedExpertsMethods` holds that form, which the plugin sets on the
class. Compiled, the concatenation was a kernel of its own that read and wrote both halves once more.

This is a layer-level change, not an operator: the GEMMs stay vllm-omni's own (its grouped linears,
tensor-parallel reductions included), and the activation stays a torch expression that the compiler
fuses with the modality groups' concatenation around it; an opaque operator would end that fusion.
"""

from __future__ import annotations

from typing import Any

import torch

from magi2_core.contracts.moe import swiglu7

__all__ = ["METHODS", "SharedExpertsMethods", "interleaved_swiglu7"]

METHODS = ("_shared_experts",)


def interleaved_swiglu7(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU7 of interleaved ``(gate, linear)`` columns, computed in FP32 and cast back to ``x``'s dtype
    (vllm-omni's ``layers.swiglu7`` with its defaults: the same operations in the same order)."""
    x32 = x.to(torch.float32)
    return swiglu7(x32[..., ::2], x32[..., 1::2]).to(x.dtype)


class SharedExpertsMethods:
    """The replacement of vllm-omni's ``Magi2MultiHeadMoELayer._shared_experts`` (``self`` is that layer)."""

    def _shared_experts(self: Any, normalized: torch.Tensor, dispatcher: Any) -> torch.Tensor:
        shared = interleaved_swiglu7(self.shared_expert_fc1(normalized))
        modality = interleaved_swiglu7(self.modality_specific_shared_expert_fc1(normalized, dispatcher))
        return self.shared_expert_fc2(shared) + self.modality_specific_shared_expert_fc2(  # type: ignore[no-any-return]
            modality, dispatcher
        )
