"""Exact ``output_gate``: the row gather, ``sigmoid`` and the product in float64, one cast."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from magi2_core.backend import OutputGateCall

__all__ = ["reference_output_gate"]


@torch.no_grad()
def reference_output_gate(call: OutputGateCall) -> torch.Tensor:
    """The ``reference`` provider: ``x[index]·sigmoid(gate)`` in float64, cast once to ``call.out_dtype``."""
    x = call.x.double()
    if call.index is not None:
        x = x.index_select(0, call.index.long())
    t, h = x.shape[0], x.shape[1]
    gate = torch.sigmoid(call.gate.double().reshape(t, h, 1))
    return (x * gate).to(call.out_dtype)
