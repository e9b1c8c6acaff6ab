"""``output_gate`` in plain torch: the gather, then ``x·sigmoid(gate)`` in FP32, one cast.

vllm-omni 0.30.0's ``Magi2Attention.output`` computes the same product in the activations' dtype in eager
mode (``sigmoid`` rounded before the product); under ``torch.compile`` inductor computes it in FP32 and
rounds once, which is this form and the op's contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from magi2_core.backend import CheckedOn, Problem, Reason, VirtualDevice, absent_device

if TYPE_CHECKING:
    from magi2_core.backend import OutputGateCall

__all__ = ["TorchOutputGate", "torch_output_gate"]


class TorchOutputGate:
    def check(self, problem: Problem) -> Sequence[Reason]:
        return absent_device(problem.device_type)

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        return CheckedOn()  # plain torch: runs on every device torch does

    @torch.no_grad()
    def __call__(self, call: OutputGateCall) -> torch.Tensor:
        x = call.x if call.index is None else call.x.index_select(0, call.index)
        t, h = x.shape[0], x.shape[1]
        return (x.float() * torch.sigmoid(call.gate.float().reshape(t, h, 1))).to(call.out_dtype)


torch_output_gate = TorchOutputGate()
