"""RMSNorm through ``F.rms_norm`` on the FP32 input (no affine), then ``(w + 1)`` and one cast.

This is the composite of vllm-omni #7286; on CUDA it uses torch's fused rms_norm kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from magi2_backend_reference.rmsnorm import broadcast_scale
from magi2_core.backend import CheckedOn, Problem, Reason, VirtualDevice, absent_device

if TYPE_CHECKING:
    from magi2_core.backend import RMSNormCall

__all__ = ["TorchRMSNorm", "torch_rmsnorm"]


class TorchRMSNorm:
    def check(self, problem: Problem) -> Sequence[Reason]:
        return absent_device(problem.device_type)

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        return CheckedOn()  # torch's rms_norm runs on every device torch does

    def __call__(self, call: RMSNormCall) -> torch.Tensor:
        x = call.x
        n = F.rms_norm(x.float(), (x.shape[-1],), None, call.eps)
        return (n * broadcast_scale(x, call.weight, call.modality_sizes)).to(call.out_dtype)


torch_rmsnorm = TorchRMSNorm()
