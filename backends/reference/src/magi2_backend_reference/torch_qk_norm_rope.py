"""``qk_norm_rope`` in vllm-omni 0.30.0's own form: the FP32 norm, ``index_select``, ``apply_rotary_emb``.

Each step writes an FP32 tensor, as ``Magi2Attention.project`` does; only the cast is the op's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from magi2_backend_reference.qk_norm_rope import scales_per_row
from magi2_core.backend import CheckedOn, Problem, Reason, VirtualDevice, absent_device

if TYPE_CHECKING:
    from magi2_core.backend import QKNormRopeCall

__all__ = ["TorchQKNormRope", "torch_qk_norm_rope"]


class TorchQKNormRope:
    def check(self, problem: Problem) -> Sequence[Reason]:
        return absent_device(problem.device_type)

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        return CheckedOn()  # plain torch: runs on every device torch does

    def __call__(self, call: QKNormRopeCall) -> torch.Tensor:
        x = call.x.float()
        n = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + call.eps)
        n = n * scales_per_row(call).float()
        if call.index is not None:
            n = n.index_select(0, call.index)
        sin, cos = call.rope.float().tensor_split(2, dim=-1)
        r = call.rope.shape[1]
        cos, sin = torch.cat((cos, cos), dim=-1).unsqueeze(-2), torch.cat((sin, sin), dim=-1).unsqueeze(-2)
        lo, hi = n[..., : r // 2], n[..., r // 2 : r]
        rotated = n[..., :r] * cos + torch.cat((-hi, lo), dim=-1) * sin
        return torch.cat((rotated, n[..., r:]), dim=-1).to(call.out_dtype)


torch_qk_norm_rope = TorchQKNormRope()
