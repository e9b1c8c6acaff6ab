"""Fused ``qk_norm_rope``: the per-head q/k norm, the row gather and RoPE in one pass, cast once.

Rows are (output token, head) pairs, ``r = t·H + h``; each program owns a tile of rows. A row reads its
source token ``index[t]`` in place (x may be a column view of the packed QKV projection: three strides)
as three contiguous pieces, the two rotated halves ``[0, R/2)``, ``[R/2, R)`` and the pass-through tail
``[R, D)``, so that each element's rotation partner sits at the same lane of the other half. It reduces
the FP32 sum of squares, scales by the source token's modality ``w[m] + 1``, rotates, and stores the
result once in the output dtype, contiguous, in output order. Upstream writes three FP32 tensors on the
way.

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
    BLOCK_H: tl.constexpr,
    BLOCK_P: tl.constexpr,
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
    bad = row_ok & ((src < 0) | (src >= T))  # an index outside the tokens: never dereferenced, a NaN row
    mine = row_ok & (src >= lo) & (src < hi)  # rows whose source lies in this launch's groups (never bad)
    load = mine[:, None]
    # A head's row in three contiguous pieces: the rotated halves [0, R/2) and [R/2, R), and the
    # pass-through tail [R, D). Each piece is one vector load; the halves are each other's partners.
    c = tl.arange(0, BLOCK_H)
    c_ok = (c < HALF)[None, :]
    p = R + tl.arange(0, BLOCK_P)
    p_ok = (p < D)[None, :]
    x_row = x_ptr + src[:, None] * stride_xt + head[:, None] * stride_xh
    x1 = tl.load(x_row + c[None, :] * stride_xd, mask=load & c_ok, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + (c + HALF)[None, :] * stride_xd, mask=load & c_ok, other=0.0).to(tl.float32)
    xp = tl.load(x_row + p[None, :] * stride_xd, mask=load & p_ok, other=0.0).to(tl.float32)
    sum_sq = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1) + tl.sum(xp * xp, axis=1)
    inv_rms = tl.math.rsqrt(sum_sq / D + eps)[:, None]

    mod = tl.zeros_like(src)  # the source token's group within this launch
    if NUM_MOD > 1:
        mod += (src >= b1).to(tl.int64)
    if NUM_MOD > 2:
        mod += (src >= b2).to(tl.int64)
    if NUM_MOD > 3:
        mod += (src >= b3).to(tl.int64)
    w_row = w_ptr + mod[:, None] * stride_wm
    w1 = tl.load(w_row + c[None, :], mask=load & c_ok, other=0.0)
    w2 = tl.load(w_row + (c + HALF)[None, :], mask=load & c_ok, other=0.0)
    wp = tl.load(w_row + p[None, :], mask=load & p_ok, other=0.0)
    if ADD_ONE:
        w1 = w1 + 1.0
        w2 = w2 + 1.0
        wp = wp + 1.0
    # Upstream's association: (x · rsqrt(...)) · (w + 1).
    n1 = (x1 * inv_rms) * w1
    n2 = (x2 * inv_rms) * w2
    n_tail = (xp * inv_rms) * wp

    r_row = rope_ptr + tok[:, None] * stride_rt
    r_ok = row_ok[:, None] & c_ok
    sin = tl.load(r_row + c[None, :] * stride_rd, mask=r_ok, other=0.0).to(tl.float32)
    cos = tl.load(r_row + (c + HALF)[None, :] * stride_rd, mask=r_ok, other=0.0).to(tl.float32)
    # x·cos + rotate_half(x)·sin, rotate_half(x) = (-x2, x1).
    y1 = n1 * cos + (-n2) * sin
    y2 = n2 * cos + n1 * sin

    nan = float("nan")
    out = (mine | bad)[:, None]
    bad = bad[:, None]
    y_row = y_ptr + rows[:, None] * D
    tl.store(y_row + c[None, :], _cast(tl.where(bad, nan, y1), Y_DTYPE, RNE), mask=out & c_ok)
    tl.store(y_row + (c + HALF)[None, :], _cast(tl.where(bad, nan, y2), Y_DTYPE, RNE), mask=out & c_ok)
    tl.store(y_row + p[None, :], _cast(tl.where(bad, nan, n_tail), Y_DTYPE, RNE), mask=out & p_ok)


def _tile(half: int, tail: int, n_rows: int) -> tuple[int, int, int, int]:
    """(BLOCK_R, BLOCK_H, BLOCK_P, num_warps) for rows of two rotated halves and a pass-through tail."""
    block_h, block_p = triton.next_power_of_2(half), triton.next_power_of_2(max(tail, 1))
    width = 2 * block_h + block_p
    fits = 1 << ((_TILE_ELEMS // width).bit_length() - 1)  # the largest power of two of rows that fit
    block_r = max(1, min(fits, triton.next_power_of_2(max(n_rows, 1))))
    # About 16 elements per thread; a power of two of warps, as Triton needs.
    num_warps = min(_MAX_WARPS, 1 << (max(1, block_r * width // (32 * 16)).bit_length() - 1))
    return block_r, block_h, block_p, num_warps


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
    n_rows, rotary = t * h, rope.shape[1]
    block_r, block_h, block_p, num_warps = _tile(rotary // 2, d - rotary, n_rows)
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
                rotary // 2,
                rotary,
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
                BLOCK_H=block_h,
                BLOCK_P=block_p,
                num_warps=num_warps,
            )
        t0 = t1
    return y
