"""Fused ``qk_norm_rope``: the per-head q/k norm, the row gather and RoPE in one pass, cast once.

Rows are (output token, head) pairs, ``r = t·H + h``; each program owns a tile of rows of the full head
width. A row reads its source token ``index[t]`` in place (x may be a column view of the packed QKV
projection: three strides, the last one contiguous or not), reduces the FP32 sum of squares, scales by
the source token's modality ``w[m] + 1`` and rotates: the partner of dim ``i < R`` is ``i ± R/2``, loaded
a second time from the same cache lines rather than moved between lanes. The result is stored once in
the output dtype, contiguous, in output order. Upstream writes three FP32 tensors on the way.

Modalities, as in the RMSNorm kernel: host-side group sizes become token boundaries passed as scalar
arguments (CUDA-graph safe); up to ``_MOD_PER_LAUNCH`` groups per launch, weight rows restricted to a
launch's groups by pointer offset. With an index, every launch covers all output rows and writes only
those whose source lies in its groups. A source outside ``[0, T)`` is never read: its row is NaN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from magi2_backend_triton.interpret import interpreting
from magi2_backend_triton.mhc_pre import _TL_DTYPE, _cast

if TYPE_CHECKING:
    from magi2_core.backend import QKNormRopeCall

__all__ = ["launch_qk_norm_rope"]

# MAGI-2 has 3 modalities; one launch serves 4 (boundaries b1..b3 as scalars).
_MOD_PER_LAUNCH = 4
# Elements per program and the warp cap, as the RMSNorm kernel (32 rows of a 128-wide head).
_TILE_ELEMS = 4096
_MAX_WARPS = 8


@triton.jit(do_not_specialize=["n_rows", "T", "lo", "b1", "b2", "b3", "hi"])
def _qk_norm_rope_kernel(
    x_ptr,
    w_ptr,
    rope_ptr,
    idx_ptr,
    y_ptr,
    n_rows,
    T,
    H,
    D,
    HALF,
    R,
    stride_xt,
    stride_xh,
    stride_xd,
    stride_wm,
    stride_rt,
    stride_rd,
    lo,
    b1,
    b2,
    b3,
    hi,
    eps,
    NUM_MOD: tl.constexpr,
    HAS_INDEX: tl.constexpr,
    ADD_ONE: tl.constexpr,
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
    valid = (src >= 0) & (src < T)  # an index outside the tokens is never dereferenced
    mine = row_ok & (src >= lo) & (src < hi)  # rows whose source lies in this launch's groups
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    # Half-split pairs: dim i < HALF pairs with i + HALF, HALF <= i < R with i - HALF, the rest with itself.
    partner = tl.where(cols < HALF, cols + HALF, tl.where(cols < R, cols - HALF, cols))
    load = (mine & valid)[:, None] & col_ok[None, :]
    base = src[:, None] * stride_xt + head[:, None] * stride_xh
    x = tl.load(x_ptr + base + cols[None, :] * stride_xd, mask=load, other=0.0).to(tl.float32)
    xp = tl.load(x_ptr + base + partner[None, :] * stride_xd, mask=load, other=0.0).to(tl.float32)
    inv_rms = tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)

    mod = tl.zeros_like(src)  # the source token's group within this launch
    if NUM_MOD > 1:
        mod += (src >= b1).to(tl.int64)
    if NUM_MOD > 2:
        mod += (src >= b2).to(tl.int64)
    if NUM_MOD > 3:
        mod += (src >= b3).to(tl.int64)
    w_row = w_ptr + mod[:, None] * stride_wm
    w = tl.load(w_row + cols[None, :], mask=load, other=0.0)
    wp = tl.load(w_row + partner[None, :], mask=load, other=0.0)
    if ADD_ONE:
        w = w + 1.0
        wp = wp + 1.0
    # Upstream's association: (x · rsqrt(...)) · (w + 1).
    n = (x * inv_rms[:, None]) * w
    n_partner = (xp * inv_rms[:, None]) * wp

    rot = col_ok & (cols < R)
    angle = tl.where(cols < HALF, cols, cols - HALF)
    r_off = tok[:, None] * stride_rt
    sin = tl.load(rope_ptr + r_off + angle[None, :] * stride_rd, mask=row_ok[:, None] & rot[None, :], other=0.0)
    cos = tl.load(
        rope_ptr + r_off + (angle + HALF)[None, :] * stride_rd, mask=row_ok[:, None] & rot[None, :], other=1.0
    )
    sign = tl.where(cols < HALF, -1.0, 1.0)
    # x·cos + rotate_half(x)·sin, rotate_half(x)_i = -x_(i+R/2) below R/2 and x_(i-R/2) above.
    y = n * cos.to(tl.float32) + (sign[None, :] * n_partner) * sin.to(tl.float32)
    y = tl.where(rot[None, :], y, n)
    y = tl.where(valid[:, None], y, float("nan"))

    y_off = rows[:, None] * D + cols[None, :]
    tl.store(y_ptr + y_off, _cast(y, Y_DTYPE, RNE), mask=(mine | (row_ok & ~valid))[:, None] & col_ok[None, :])


def _tile(d: int, n_rows: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_D, num_warps) for rows of width d."""
    block_d = triton.next_power_of_2(d)
    block_r = max(1, min(_TILE_ELEMS // block_d, triton.next_power_of_2(max(n_rows, 1))))
    num_warps = max(1, min(_MAX_WARPS, block_r * block_d // (32 * 16)))
    return block_r, block_d, num_warps


def launch_qk_norm_rope(call: QKNormRopeCall) -> torch.Tensor:
    """Run the kernel for a validated call; returns a new contiguous ``[T, H, D]`` tensor."""
    x, weight, rope, index = call.x, call.weight, call.rope, call.index
    t, h, d = x.shape
    y = torch.empty((t, h, d), dtype=call.out_dtype, device=x.device)
    if t == 0:
        return y
    if weight.dtype == torch.float32:
        scale, add_one = weight, True
    else:
        # A low-precision weight rounds w + 1 in its own dtype before the FP32 multiply, as upstream's module.
        scale, add_one = (weight + 1).float(), False
    scale = scale.contiguous()
    sizes = [t] if call.modality_sizes is None else list(call.modality_sizes)
    n_rows = t * h
    block_r, block_d, num_warps = _tile(d, n_rows)
    t0 = 0
    for g0 in range(0, len(sizes), _MOD_PER_LAUNCH):
        group = sizes[g0 : g0 + _MOD_PER_LAUNCH]
        t1 = t0 + sum(group)
        # Absolute token boundaries inside this launch's range [t0, t1); unused ones are never compared.
        bounds = [t0 + sum(group[: i + 1]) for i in range(len(group) - 1)]
        bounds += [t1] * (_MOD_PER_LAUNCH - 1 - len(bounds))
        if t1 > t0:  # every launch also writes the NaN rows of sources outside [0, T)
            _qk_norm_rope_kernel[(triton.cdiv(n_rows, block_r),)](
                x,
                scale[g0:],
                rope,
                index if index is not None else x,
                y,
                n_rows,
                t,
                h,
                d,
                rope.shape[1] // 2,
                rope.shape[1],
                x.stride(0),
                x.stride(1),
                x.stride(2),
                scale.stride(0),
                rope.stride(0),
                rope.stride(1),
                t0,
                bounds[0],
                bounds[1],
                bounds[2],
                t1,
                float(call.eps),
                NUM_MOD=len(group),
                HAS_INDEX=index is not None,
                ADD_ONE=add_one,
                Y_DTYPE=_TL_DTYPE[call.out_dtype],
                RNE=interpreting() and call.out_dtype == torch.bfloat16,
                BLOCK_R=block_r,
                BLOCK_D=block_d,
                num_warps=num_warps,
            )
        t0 = t1
    return y
