"""Fused multi-modality RMSNorm (operators.md §4): FP32 normalise, modality-major ``(w + 1)`` scale, one cast.

One pass over the data: each program loads a tile of rows once, reduces the FP32 sum of squares in
registers, scales by the row's ``w[m, p] + 1`` and stores the result once (in the output dtype, and
optionally also the pre-cast FP32 value so the contract "output == FP32 result cast" can be checked).

Row addressing. The input ``x[T, ..., P', D]`` is viewed as ``[T, K, D]``: dim 0 is the token axis
that the modality groups split (as upstream's dispatcher and the reference do), and the K rows of a
token (``K = P'`` for ``[T, P', D]``, 1 for ``[T, D]``) share its modality. Row ``r`` of the ``T·K``
rows is token ``r // K`` and sub-row ``k = r % K``; its pattern (weight row) is ``k % P'`` when
``P > 1``. Addresses use the view's three strides, so column slices of wider rows (``x[..., :D]``) and
even strided last dims are read in place; only middle dims that cannot be collapsed into one stride
are copied (``reshape``).

Modalities. Host-side group sizes become token boundaries passed as scalar kernel arguments (no
host-to-device copy, so the call is CUDA-graph safe); the kernel finds a token's modality by counting
the boundaries it has passed. One launch covers up to ``_MOD_PER_LAUNCH`` modalities; more are
handled by one launch per run of that many groups.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from magi2_core.backend import validate_rmsnorm

__all__ = ["launch_rmsnorm", "triton_rmsnorm"]

# Boundaries b1..b3 are scalar arguments: MAGI-2 uses at most 3 modalities, one launch serves 4.
_MOD_PER_LAUNCH = 4

# Elements per program tile and the warp cap, from the H200 sweep (docs/rmsnorm-notes.md): ~4K
# elements per program (32 rows at D=128, one row at D=3072), at most 8 warps (one 12288-wide row:
# 8 warps 3.81 TB/s vs 16 warps 3.73 vs 32 warps 3.27).
_TILE_ELEMS = 4096
_MAX_WARPS = 8


@triton.jit(do_not_specialize=["n_rows", "n_sub", "b1", "b2", "b3"])
def _rmsnorm_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    y32_ptr,
    n_rows,
    n_sub,
    n_wpat,
    D,
    stride_xt,
    stride_xp,
    stride_xd,
    w_stride_m,
    w_stride_p,
    b1,
    b2,
    b3,
    eps,
    NUM_MOD: tl.constexpr,
    ADD_ONE: tl.constexpr,
    WRITE_Y32: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    # int64 row index: T·P'·D and T·stride exceed 2**31 at MAGI-2 sizes ([T, 24, 128] at T ~ 1e6).
    rows = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < n_rows
    tok = rows // n_sub
    sub = rows - tok * n_sub
    cols = tl.arange(0, BLOCK_D)
    col_ok = cols < D
    mask = row_ok[:, None] & col_ok[None, :]

    x_off = tok[:, None] * stride_xt + sub[:, None] * stride_xp + cols[None, :] * stride_xd
    # Masked lanes load 0 so they add nothing to the sum of squares.
    x = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    mean_sq = tl.sum(x * x, axis=1) / D
    inv_rms = tl.math.rsqrt(mean_sq + eps)

    # Token's modality = number of group boundaries at or below it (groups are contiguous in t).
    mod = tl.zeros_like(tok)
    if NUM_MOD > 1:
        mod += (tok >= b1).to(tl.int64)
    if NUM_MOD > 2:
        mod += (tok >= b2).to(tl.int64)
    if NUM_MOD > 3:
        mod += (tok >= b3).to(tl.int64)
    pat = sub % n_wpat  # weight pattern; n_wpat = 1 (and w_stride_p = 0) when P = 1 broadcasts
    w_off = mod[:, None] * w_stride_m + pat[:, None] * w_stride_p + cols[None, :]
    # The weight is tiny ([M, P, D] FP32) and stays in L1/L2; reloading it per row costs no DRAM.
    w = tl.load(w_ptr + w_off, mask=mask, other=0.0)
    if ADD_ONE:
        w = w + 1.0
    # Same association as the reference: (x * rsqrt(...)) then * (w + 1).
    y = (x * inv_rms[:, None]) * w

    y_off = rows[:, None] * D + cols[None, :]
    if WRITE_Y32:
        tl.store(y32_ptr + y_off, y, mask=mask)
    tl.store(y_ptr + y_off, y.to(y_ptr.dtype.element_ty), mask=mask)


def _tile(d: int, n_rows: int) -> tuple[int, int, int]:
    """(BLOCK_R, BLOCK_D, num_warps) for rows of width d."""
    block_d = triton.next_power_of_2(d)
    block_r = max(1, min(_TILE_ELEMS // block_d, triton.next_power_of_2(max(n_rows, 1))))
    elems = block_r * block_d
    # ~16 elements per thread keeps loads 16-byte wide; wider rows get more per thread, not more warps.
    num_warps = max(1, min(_MAX_WARPS, elems // (32 * 16)))
    return block_r, block_d, num_warps


def _as_token_view(x: torch.Tensor) -> torch.Tensor:
    """``x[T, ..., D]`` as ``[T, K, D]`` without copying when the middle dims collapse into one stride."""
    k = 1
    for n in x.shape[1:-1]:
        k *= n
    try:
        return x.view(x.shape[0], k, x.shape[-1])
    except RuntimeError:
        # Middle dims with incompatible strides (e.g. a transposed [T, B, P, D]): one copy is unavoidable.
        return x.reshape(x.shape[0], k, x.shape[-1])


def triton_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    modality_sizes: Sequence[int] | None,
    out_dtype: torch.dtype | None,
    fp32_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Multi-modality RMSNorm in one pass: ``cast((x·rsqrt(mean(x²)+eps)) · (w[m, p] + 1))``.

    x: ``[T, D]`` or ``[T, ..., P', D]`` (any float dtype; the last dim may be strided); modality groups
        split dim 0, as in the reference.
    weight: ``[M, P, D]`` delta-scale; FP32 is used as is (``w + 1`` formed in FP32 in the kernel);
        a lower-precision weight has ``w + 1`` formed in its own dtype first, as the module does.
        P = 1 broadcasts over x's pattern axis; P > 1 needs ``x.shape[-2] == P``.
    modality_sizes: M contiguous token-group sizes summing to T (empty groups allowed); None = one.
    out_dtype: output dtype (default ``x.dtype``); the FP32 result is cast exactly once.
    fp32_out: optional contiguous FP32 tensor of x's shape that receives the pre-cast result.
    Returns a new contiguous tensor of x's shape.
    """
    call = validate_rmsnorm(x, weight, eps=eps, modality_sizes=modality_sizes, out_dtype=out_dtype, compiling=False)
    return launch_rmsnorm(
        call.x,
        call.weight,
        eps=call.eps,
        modality_sizes=call.modality_sizes,
        out_dtype=call.out_dtype,
        fp32_out=fp32_out,
    )


def launch_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float,
    modality_sizes: Sequence[int] | None,
    out_dtype: torch.dtype | None,
    fp32_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`triton_rmsnorm` for inputs the op contract has already validated (the provider's path)."""
    sizes = [x.shape[0]] if modality_sizes is None else list(modality_sizes)
    _, p, d = weight.shape
    y = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    if fp32_out is not None and (
        fp32_out.shape != x.shape or fp32_out.dtype != torch.float32 or not fp32_out.is_contiguous()
    ):
        raise ValueError(f"fp32_out must be a contiguous FP32 tensor of shape {tuple(x.shape)}")
    if x.numel() == 0:
        return y

    if weight.dtype == torch.float32:
        scale, add_one = weight.contiguous(), True
    else:
        # Low-precision weights round w + 1 in their own dtype before the FP32 multiply (operators.md §4.1).
        scale, add_one = (weight + 1).float(), False

    xv = _as_token_view(x)
    yv = y.view(xv.shape)
    y32v = fp32_out.view(xv.shape) if fp32_out is not None else yv
    n_wpat = p if p > 1 else 1  # x.shape[-2] == P was checked, so sub-row k has pattern k % P

    t0 = 0
    for g0 in range(0, len(sizes), _MOD_PER_LAUNCH):
        group = sizes[g0 : g0 + _MOD_PER_LAUNCH]
        t1 = t0 + sum(group)
        if t1 > t0:
            # Boundaries relative to this launch's first token; unused ones are never compared.
            bounds = [sum(group[: i + 1]) for i in range(len(group) - 1)]
            bounds += [0] * (_MOD_PER_LAUNCH - 1 - len(bounds))
            xs, ys = xv[t0:t1], yv[t0:t1]
            n_rows = xs.shape[0] * xs.shape[1]
            block_r, block_d, num_warps = _tile(d, n_rows)
            _rmsnorm_kernel[(triton.cdiv(n_rows, block_r),)](
                xs,
                scale[g0:],
                ys,
                y32v[t0:t1],
                n_rows,
                xs.shape[1],
                n_wpat,
                d,
                xs.stride(0),
                xs.stride(1),
                xs.stride(2),
                scale.stride(0),
                d if p > 1 else 0,
                bounds[0],
                bounds[1],
                bounds[2],
                float(eps),
                NUM_MOD=len(group),
                ADD_ONE=add_one,
                WRITE_Y32=fp32_out is not None,
                BLOCK_R=block_r,
                BLOCK_D=block_d,
                num_warps=num_warps,
            )
        t0 = t1
    return y
