"""Fused ``output_gate``: attention's output rows gathered, gated by ``sigmoid`` per head, cast once.

Rows are (output token, head) pairs, ``r = t·H + h``; each program owns a tile of rows. A row reads its
source token ``index[t]`` in place (x may be any strided view) as one contiguous piece of D elements,
multiplies it in FP32 by ``sigmoid`` of its gate logit, and stores it once in the output dtype,
contiguous, in output order. Upstream's compiled form reads the source through a gathered index per
element; here the index is read once per row, so the row stays one vector load.

A source outside ``[0, T)`` is never read: its row is NaN (as ``qk_norm_rope``'s kernel does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from magi2_backend_triton.interpret import interpreting
from magi2_backend_triton.mhc_pre import _TL_DTYPE, _cast

if TYPE_CHECKING:
    from magi2_core.backend import OutputGateCall

__all__ = ["launch_output_gate"]

# Elements per program and the warp cap, as the q/k kernel (32 rows of a 128-wide head).
_TILE_ELEMS = 4096
_MAX_WARPS = 8


@triton.jit(do_not_specialize=["n_rows", "T"])
def _output_gate_kernel(
    x_ptr,
    g_ptr,
    idx_ptr,
    y_ptr,
    n_rows,
    T,
    H,
    stride_xt,
    stride_xh,
    stride_xd,
    stride_gt,
    stride_gh,
    D: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    Y_DTYPE: tl.constexpr,
    RNE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    # int64 rows: T·H·D and T·stride exceed 2**31 at MAGI-2 sizes.
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    tok = rows // H
    head = rows - tok * H
    if HAS_INDEX:
        src = tl.load(idx_ptr + tok, mask=row_ok, other=0).to(tl.int64)
    else:
        src = tok
    inside = (src >= 0) & (src < T)  # an index outside the tokens: never dereferenced, a NaN row
    c = tl.arange(0, BLOCK_D)
    c_ok = (c < D)[None, :]
    x_row = x_ptr + src[:, None] * stride_xt + head[:, None] * stride_xh
    x = tl.load(x_row + c[None, :] * stride_xd, mask=(row_ok & inside)[:, None] & c_ok, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + tok * stride_gt + head * stride_gh, mask=row_ok, other=0.0).to(tl.float32)
    y = tl.where(inside[:, None], x * tl.sigmoid(g)[:, None], float("nan"))
    tl.store(y_ptr + rows[:, None] * D + c[None, :], _cast(y, Y_DTYPE, RNE), mask=row_ok[:, None] & c_ok)


def _tile(d: int, n_rows: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_D, num_warps) for rows of ``d`` elements."""
    block_d = triton.next_power_of_2(d)
    fits = max(1, _TILE_ELEMS // block_d)
    block_r = max(1, min(fits, triton.next_power_of_2(max(n_rows, 1))))
    # About 16 elements per thread; a power of two of warps, as Triton needs.
    num_warps = min(_MAX_WARPS, 1 << (max(1, block_r * block_d // (32 * 16)).bit_length() - 1))
    return block_r, block_d, num_warps


def launch_output_gate(call: OutputGateCall) -> torch.Tensor:
    """Run the kernel for a validated call; returns a new contiguous ``[T, H, D]`` tensor."""
    x, gate, index = call.x, call.gate, call.index
    t, h, d = x.shape
    y = torch.empty((t, h, d), dtype=call.out_dtype, device=x.device)
    if t == 0:
        return y
    n_rows = t * h
    block_r, block_d, num_warps = _tile(d, n_rows)
    _output_gate_kernel[(triton.cdiv(n_rows, block_r),)](
        x,
        gate,
        index if index is not None else x,
        y,
        n_rows,
        t,
        h,
        x.stride(0),
        x.stride(1),
        x.stride(2),
        gate.stride(0),
        gate.stride(1),
        D=d,
        HAS_INDEX=index is not None,
        Y_DTYPE=_TL_DTYPE[call.out_dtype],
        RNE=interpreting() and call.out_dtype == torch.bfloat16,
        BLOCK_R=block_r,
        BLOCK_D=block_d,
        num_warps=num_warps,
    )
    return y
