"""Launchers of the Gluon one-kernel fused MoE kernels: Hopper GPUs only.

Three kernels share one contract and are bit-equal: `kernels_gluon.fused_expert_gluon_kernel`
("gluon", one 8-warp program per aligned row block), `kernels_gluon.fused_expert_gluon_routed_kernel`
("gluon_routed", one program per expert over unpadded route lists) and
`kernels_gluon_ws.fused_expert_gluon_ws_kernel` ("gluon_ws", persistent and warp-specialised).

Programmatic dependent launch: a kernel so launched may start before the previous kernel in the
stream ends, and sees that kernel's writes only after `griddepcontrol.wait`. The row-block kernels
read their block's expert and the padded count *before* that wait (to start the weight copies
early), which is safe only when the previous kernel is the alignment's scatter: it triggers its
dependents, and the kernels that wrote those two had finished before it started. After the torch
statement of the stable alignment (``stable_torch``) the last kernel writes the padded count itself,
so that launch is plain (`dependent_launch`). The per-expert kernel reads its lists only after the wait.

The kernel module imports `triton.experimental.gluon`, which older Tritons (and the interpreter)
lack, so it is imported on first use and every reason it cannot run is a value
(`gluon_unsupported_reason`): the plan (`plan.py`) only picks the variant where it can, and a call
that asks for it anyway gets an error naming the reason (no silent fallback).
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import torch
import triton
from torch import Tensor

from magi2_core.backend import InvalidValueError

from ..interpret import interpreting as _interpreting
from .align import ExpertLists, RouteBuffers
from .operands import Operands, bank, kernel_operands, row_blocks
from .tiles import Launch, SliceTile

_SHARED_LIMIT = 227 * 1024  # Hopper's opt-in shared memory per block
# Registers per thread of the warp-specialised kernel's consumers: a [64, d] FP32 accumulator is
# 128, the two gate/up results 64; 232 leaves no spills (ptxas, sm_90) and the loader warp 40.
_WS_CONSUMER_REGS = 232


def _shared_bytes(d: int, tile: SliceTile, variant: str) -> int:
    # Activation block, `num_stages` gate/up and down slices, two SwiGLU7 slices (the A operand
    # of the down projection), one mbarrier per weight buffer (two, full and empty, in the
    # warp-specialised kernel). The 128-row, 32-wide, 3-stage tile needs 229,432 B (229,728 B
    # warp-specialised; the compiler's figures), just under the limit.
    bm, bi, stages = tile.block_m, tile.block_i, tile.num_stages
    barriers = 2 if variant == "gluon_ws" else 1
    return 2 * (bm * d + stages * 3 * bi * d + 2 * bm * bi) + 16 * stages * barriers


@functools.lru_cache(maxsize=1)
def _kernels() -> tuple[ModuleType, ModuleType] | str:
    """The kernel modules (row block, warp-specialised), or why this Triton cannot import them."""
    try:
        return (
            importlib.import_module(".kernels_gluon", __package__),
            importlib.import_module(".kernels_gluon_ws", __package__),
        )
    except Exception as e:  # ImportError, or an older Gluon whose API differs
        return f"Triton {triton.__version__} cannot build the Gluon kernel ({type(e).__name__}: {e})"


def gluon_import_error() -> str | None:
    """Why this Triton cannot build the Gluon kernel, or None when it can (any device)."""
    kernels = _kernels()
    return kernels if isinstance(kernels, str) else None


@functools.lru_cache(maxsize=16)
def _capability(device: torch.device) -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(device)
    return major, minor


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


@functools.lru_cache(maxsize=64)  # asked by the plan and on every launch
def gluon_shape_reason(d: int, inter: int, dtype: torch.dtype, tile: SliceTile, variant: str = "gluon") -> str | None:
    """Why the ``variant`` kernel cannot take this shape and tile, or None when it can (no device needed)."""
    bi = tile.block_i
    if dtype not in (torch.bfloat16, torch.float16):
        return f"the wgmma kernel takes 2-byte activations; got {dtype}"
    if d not in (128, 256):
        return f"d must be 128 or 256 (one wgmma N, the widths tested on the H200); got {d}"
    if bi & (bi - 1) or not 8 <= bi <= 128 or inter % bi or inter // bi < 3:
        return f"the intermediate ({inter}) must be at least 3 slices of a power-of-two BLOCK_I (got {bi})"
    if tile.block_m not in (64, 128) or tile.num_warps != tile.block_m // 16:
        return f"row blocks of 64 or 128 with one warp per 16 rows; got {tile.block_m} rows, {tile.num_warps} warps"
    if tile.num_stages < 2:
        return f"the weight rings need at least 2 stages; got {tile.num_stages}"
    if variant == "gluon_ws" and tile.block_m != 128:
        return f"the warp-specialised kernel takes 128-row blocks (two 64-row consumers); got {tile.block_m}"
    shared = _shared_bytes(d, tile, variant)
    if shared > _SHARED_LIMIT:
        return f"needs {shared} B of shared memory, more than {_SHARED_LIMIT}"
    return None


def gluon_device_reason(device_type: str, capability: tuple[int, int] | None) -> str | None:
    """Why the Gluon kernel cannot run on a device of this type and capability with this Triton, or None."""
    if _interpreting():
        return "the Triton interpreter cannot run Gluon kernels"
    if device_type != "cuda":
        return f"the Gluon kernel needs a CUDA device; got {device_type}"
    if capability is None or capability[0] != 9:
        got = "an unknown capability" if capability is None else f"{capability[0]}.{capability[1]}"
        return f"the Gluon kernel uses Hopper's wgmma (compute capability 9.x); got {got}"
    return gluon_import_error()


def gluon_unsupported_reason(device: torch.device) -> str | None:
    """Why the Gluon kernel cannot run on ``device`` with this Triton, or None when it can."""
    if _interpreting() or device.type != "cuda":
        return gluon_device_reason(device.type, None)
    return gluon_device_reason(device.type, _capability(device))


def _descriptors(x: Tensor, w13: Tensor, w_down: Tensor, tile: SliceTile) -> tuple[object, object]:
    """TMA descriptors: the bank as [F*I, 2d] (row j is gate j then up j), w_down as [F*I, d]."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    num_experts, two_inter, d = w13.shape
    inter, bi = two_inter // 2, tile.block_i
    elem = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    layout = gl.NVMMASharedLayout.get_default_for([bi, d], elem)
    w13_desc = TensorDescriptor.from_tensor(w13.reshape(num_experts * inter, 2 * d), [bi, d], layout)
    wd_desc = TensorDescriptor.from_tensor(w_down.reshape(num_experts * inter, d), [bi, d], layout)
    return w13_desc, wd_desc


def _checked_kernels(x: Tensor, w13: Tensor, tile: SliceTile, variant: str) -> ModuleType:
    d, inter = x.shape[2], w13.shape[1] // 2
    reason = gluon_unsupported_reason(x.device) or gluon_shape_reason(d, inter, x.dtype, tile, variant)
    if reason is not None:
        raise InvalidValueError("moe_experts", "plan.variant", "'tma' or 'one_kernel' here", f"'{variant}' ({reason})")
    kernels = _kernels()
    assert not isinstance(kernels, str)
    return kernels[1] if variant == "gluon_ws" else kernels[0]


def _meta(x: Tensor, w13: Tensor, topk: int, tile: SliceTile) -> dict[str, int]:
    """The compile-time arguments every Gluon MoE kernel takes."""
    return {
        "D": x.shape[2],
        "INTER": w13.shape[1] // 2,
        "TOPK": topk,
        "BLOCK_M": tile.block_m,
        "BLOCK_I": tile.block_i,
        "STAGES": tile.num_stages,
    }


def dependent_launch(launch: Launch) -> bool:
    """Whether the row-block kernels launch with programmatic dependent launch: only right after an
    alignment's scatter kernel (the atomic and the stable kernels end with one; the torch statement of
    the stable alignment does not: the module docstring says why)."""
    return launch.align != "stable_torch"


def launch_gluon(ops: Operands, launch: Launch, routes: RouteBuffers | ExpertLists) -> None:
    """Fill ``ops.routed`` [R, d] with the per-route outputs: ``gluon``, one program per aligned row
    block, or ``gluon_ws``, one persistent warp-specialised program (loader warp, two consumers) per
    SM walking the aligned row blocks (the count of real ones is read on the device)."""
    w13, tile = bank(ops, launch)
    bufs = row_blocks(routes)
    x = ops.x
    kernels = _checked_kernels(x, w13, tile, launch.variant)
    operands = kernel_operands(ops, _descriptors(x, w13, ops.w_down, tile), bufs)
    blocks = bufs.capacity // tile.block_m
    if launch.variant == "gluon_ws":
        kernels.fused_expert_gluon_ws_kernel[(min(blocks, _sm_count(x.device)),)](
            *operands,
            **_meta(x, w13, ops.topk, tile),
            CONSUMER_REGS=_WS_CONSUMER_REGS,
            num_warps=4,  # the first consumer; the kernel adds the second and the loader warp
            launch_pdl=dependent_launch(launch),
        )
    else:
        kernels.fused_expert_gluon_kernel[(blocks,)](
            *operands,
            **_meta(x, w13, ops.topk, tile),
            num_warps=tile.num_warps,
            launch_pdl=dependent_launch(launch),
        )


def launch_gluon_routed(ops: Operands, launch: Launch, routes: RouteBuffers | ExpertLists) -> None:
    """Fill ``ops.routed`` [R, d], one program per flat expert walking its route list in row blocks."""
    assert isinstance(routes, ExpertLists), "gluon_routed reads per-expert route lists"
    w13, tile = bank(ops, launch)
    kernels = _checked_kernels(ops.x, w13, tile, "gluon_routed")
    kernels.fused_expert_gluon_routed_kernel[(w13.shape[0],)](
        *kernel_operands(ops, _descriptors(ops.x, w13, ops.w_down, tile), routes),
        **_meta(ops.x, w13, ops.topk, tile),
        num_warps=tile.num_warps,
        launch_pdl=True,  # reads the lists and counts only after griddepcontrol.wait: safe after any kernel
    )
