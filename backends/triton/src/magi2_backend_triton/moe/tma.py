"""Launcher of the Hopper (TMA) variant of the one-kernel fused MoE (`kernels_tma.py`).

Host-built tensor descriptors (`triton.tools.tensor_descriptor.TensorDescriptor`): they need no
device-side allocator, and the launcher turns them into CUtensorMaps passed by value, so a
captured CUDA graph replays them as they were. Gated per call: CUDA capability >= 9.0 and a Triton
that has the descriptors; the Triton interpreter runs it on CPU for the tests.
"""

from __future__ import annotations

import functools

import torch
import triton

from magi2_core.backend import InvalidValueError

from ..interpret import interpreting as _interpreting
from .align import ExpertLists, RouteBuffers
from .kernels_tma import fused_expert_tma_kernel
from .operands import Operands, bank, kernel_operands, row_blocks
from .tiles import Launch

try:
    from triton.tools.tensor_descriptor import TensorDescriptor

    _HAS_DESCRIPTORS = True
except ImportError:  # Triton before 3.4 (or a fork without them): no host-side descriptors
    _HAS_DESCRIPTORS = False


# Per-call host work stays at dictionary lookups: device queries cost tens of microseconds each.
@functools.lru_cache(maxsize=16)
def _capability(device: torch.device) -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(device)
    return major, minor


def tma_device_reason(device_type: str, capability: tuple[int, int] | None) -> str | None:
    """Why the TMA kernel cannot run on a device of this type and capability with this Triton, or None."""
    if not _HAS_DESCRIPTORS:
        return f"Triton {triton.__version__} has no triton.tools.tensor_descriptor (needs >= 3.4)"
    if _interpreting():  # the interpreter runs host-side descriptors on the CPU (the tests' path)
        return None
    if device_type != "cuda":
        return f"tensor descriptors need a CUDA device; got {device_type}"
    if capability is None or capability < (9, 0):
        got = "an unknown capability" if capability is None else f"{capability[0]}.{capability[1]}"
        return f"tensor descriptors need CUDA compute capability >= 9.0; got {got}"
    return None


def tma_unsupported_reason(device: torch.device) -> str | None:
    """Why the TMA kernel cannot run on ``device`` with this Triton, or None when it can."""
    cuda = device.type == "cuda" and not _interpreting() and _HAS_DESCRIPTORS
    return tma_device_reason(device.type, _capability(device) if cuda else None)


def launch_tma(ops: Operands, launch: Launch, routes: RouteBuffers | ExpertLists) -> None:
    """Fill ``ops.routed`` [R, d] with the per-route outputs, weight slices through descriptors of the
    packed [F, 2I, d] bank."""
    w13, tile = bank(ops, launch)
    bufs = row_blocks(routes)
    x = ops.x
    reason = tma_unsupported_reason(x.device)
    if reason is not None:
        raise InvalidValueError("moe_experts", "plan.variant", "'one_kernel' here", f"'tma' ({reason})")
    d = x.shape[2]
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    bi = tile.block_i
    w13_desc = TensorDescriptor.from_tensor(w13.reshape(num_experts * two_inter, d), [2 * bi, d])
    wd_desc = TensorDescriptor.from_tensor(ops.w_down.reshape(num_experts * inter, d), [bi, d])
    fused_expert_tma_kernel[(bufs.capacity // tile.block_m,)](
        *kernel_operands(ops, (w13_desc, wd_desc), bufs),
        D=d,
        INTER=inter,
        TOPK=ops.topk,
        BLOCK_M=tile.block_m,
        BLOCK_I=bi,
        UPCAST_DOT=ops.upcast,
        EXPLICIT_RNE=ops.rne,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )
