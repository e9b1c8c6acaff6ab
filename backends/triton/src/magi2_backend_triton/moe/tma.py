"""Launcher of the Hopper (TMA) variants of the one-kernel fused MoE (`kernels_tma.py`).

Host-built tensor descriptors (`triton.tools.tensor_descriptor.TensorDescriptor`): they need no
device-side allocator, and the launcher turns them into CUtensorMaps passed by value, so a
captured CUDA graph replays them as they were. Gated per call: CUDA capability >= 9.0 and a Triton
that has the descriptors (and, for the warp-specialised variants, `tl.range(warp_specialize=...)`);
the Triton interpreter runs them on CPU for the tests. Everything else keeps the pointer kernel.
"""

from __future__ import annotations

import functools
import inspect

import torch
import triton
import triton.language as tl
from torch import Tensor

from magi2_core.errors import InvalidValueError

from ..interpret import interpreting as _interpreting
from .align import RouteBuffers
from .kernels_tma import fused_expert_tma_kernel
from .tiles import GemmTile, KernelVariant

try:
    from triton.tools.tensor_descriptor import TensorDescriptor

    _HAS_DESCRIPTORS = True
except ImportError:  # Triton before 3.4 (or a fork without them): no host-side descriptors
    _HAS_DESCRIPTORS = False

# Under the interpreter the persistent walk runs on a pretend machine of this many programs, so
# the tests see programs that own several row blocks.
_INTERPRETER_PROGRAMS = 3


# Per-call host work stays at dictionary lookups: device queries cost tens of microseconds each.
@functools.lru_cache(maxsize=1)
def _has_warp_specialize() -> bool:
    return "warp_specialize" in inspect.signature(tl.range).parameters


@functools.lru_cache(maxsize=16)
def _capability(device: torch.device) -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(device)
    return major, minor


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def tma_unsupported_reason(device: torch.device, variant: KernelVariant) -> str | None:
    """Why ``variant`` cannot run on ``device`` with this Triton, or None when it can."""
    if not _HAS_DESCRIPTORS:
        return f"Triton {triton.__version__} has no triton.tools.tensor_descriptor (needs >= 3.4)"
    if variant.endswith("_ws") and not _has_warp_specialize():
        return f"Triton {triton.__version__} has no tl.range(warp_specialize=...)"
    if _interpreting():  # the interpreter runs host-side descriptors on the CPU (the tests' path)
        return None
    if device.type != "cuda":
        return f"tensor descriptors need a CUDA device; got {device.type}"
    cap = _capability(device)
    if cap < (9, 0):
        return f"tensor descriptors need CUDA compute capability >= 9.0; got {cap[0]}.{cap[1]}"
    return None


def launch_fused_tma(
    x: Tensor,
    w13: Tensor,
    w_down: Tensor,
    probs_flat: Tensor,
    routed: Tensor,
    bufs: RouteBuffers,
    *,
    topk: int,
    tile: GemmTile,
    variant: KernelVariant,
    ctas_per_sm: int,
    upcast: bool,
    rne: bool,
) -> None:
    """Fill ``routed`` [R, d] with the per-route outputs; ``w13`` is the [F, 2I, d] packed bank."""
    reason = tma_unsupported_reason(x.device, variant)
    if reason is not None:
        raise InvalidValueError("moe_experts", "tiles.variant", "'pointer' here", f"{variant!r} ({reason})")
    num_tokens, _, d = x.shape
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    bi = tile.block_n
    w13_desc = TensorDescriptor.from_tensor(w13.reshape(num_experts * two_inter, d), [2 * bi, d])
    wd_desc = TensorDescriptor.from_tensor(w_down.reshape(num_experts * inter, d), [bi, d])
    num_blocks_m = bufs.capacity // tile.block_m
    persistent = variant.startswith("tma_persistent")
    if persistent:
        machine = _INTERPRETER_PROGRAMS if _interpreting() else _sm_count(x.device) * ctas_per_sm  # no SMs there
        grid = (max(1, min(num_blocks_m, machine)),)
    else:
        grid = (num_blocks_m,)
    fused_expert_tma_kernel[grid](
        x, w13_desc, wd_desc, probs_flat, routed, bufs.sorted_ids, bufs.expert_ids, bufs.num_padded,
        num_tokens, routed.shape[0], x.stride(0), x.stride(1),
        D=d, INTER=inter, TOPK=topk, BLOCK_M=tile.block_m, BLOCK_I=bi,
        PERSISTENT=persistent, WHILE_LOOP=_interpreting(), WARP_SPECIALIZE=variant.endswith("_ws"), UPCAST_DOT=upcast, EXPLICIT_RNE=rne,
        num_warps=tile.num_warps, num_stages=tile.num_stages,
    )  # fmt: skip
