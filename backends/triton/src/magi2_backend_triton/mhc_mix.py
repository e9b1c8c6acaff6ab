"""Fused ``mhc_mix`` (operators.md §5.3): one pass over the streams and the branch output.

Each program owns a tile of tokens and channels for all ``n`` output streams: it accumulates
``Σ_j residual[t, i, j]·streams[t, j]`` in FP32 from the ``n`` input streams it loads once, forms
``post[t, i]·branch_output[t]``, rounds each term to the streams' dtype (upstream's two einsum
results) and stores their rounded sum.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from magi2_backend_triton.interpret import interpreting
from magi2_backend_triton.mhc_pre import _TL_DTYPE, _cast, _rounded

if TYPE_CHECKING:
    from magi2_core.backend import MHCMixCall

__all__ = ["launch_mhc_mix"]

_BLOCK_T = 1
_BLOCK_D = 1024


@triton.jit(do_not_specialize=["T"])
def _mhc_mix_kernel(
    x_ptr,
    y_ptr,
    p_ptr,
    r_ptr,
    o_ptr,
    T,
    D,
    stride_xt,
    stride_xn,
    stride_yt,
    stride_pt,
    stride_pn,
    stride_rt,
    stride_ri,
    stride_rj,
    N: tl.constexpr,
    NP: tl.constexpr,
    X_DTYPE: tl.constexpr,
    RNE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    row_ok = rows < T
    col_ok = cols < D
    i = tl.arange(0, NP)
    ti = row_ok[:, None] & (i < N)[None, :]
    tc = row_ok[:, None] & col_ok[None, :]
    mixed = tl.zeros((BLOCK_T, NP, BLOCK_D), tl.float32)
    for j in tl.static_range(N):
        xj = tl.load(x_ptr + rows[:, None] * stride_xt + j * stride_xn + cols[None, :], mask=tc, other=0.0)
        rj = tl.load(r_ptr + rows[:, None] * stride_rt + i[None, :] * stride_ri + j * stride_rj, mask=ti, other=0.0)
        mixed += rj.to(tl.float32)[:, :, None] * xj.to(tl.float32)[:, None, :]
    y = tl.load(y_ptr + rows[:, None] * stride_yt + cols[None, :], mask=tc, other=0.0).to(tl.float32)
    p = tl.load(p_ptr + rows[:, None] * stride_pt + i[None, :] * stride_pn, mask=ti, other=0.0).to(tl.float32)
    out = _rounded(mixed, X_DTYPE, RNE) + _rounded(p[:, :, None] * y[:, None, :], X_DTYPE, RNE)
    o_off = rows[:, None, None] * (N * D) + i[None, :, None] * D + cols[None, None, :]
    tl.store(o_ptr + o_off, _cast(out, X_DTYPE, RNE), mask=ti[:, :, None] & col_ok[None, None, :])


def launch_mhc_mix(call: MHCMixCall) -> torch.Tensor:
    """Run the mix kernel for a validated call; returns the new ``[T, n, D]`` streams."""
    x = call.streams if call.streams.stride(2) == 1 else call.streams.contiguous()
    y = call.branch_output if call.branch_output.stride(1) == 1 else call.branch_output.contiguous()
    p, r = call.post, call.residual
    t, n, d = x.shape
    out = torch.empty((t, n, d), dtype=x.dtype, device=x.device)
    if t == 0:
        return out
    _mhc_mix_kernel[(triton.cdiv(t, _BLOCK_T), triton.cdiv(d, _BLOCK_D))](
        x,
        y,
        p,
        r,
        out,
        t,
        d,
        x.stride(0),
        x.stride(1),
        y.stride(0),
        p.stride(0),
        p.stride(1),
        r.stride(0),
        r.stride(1),
        r.stride(2),
        N=n,
        NP=triton.next_power_of_2(n),
        X_DTYPE=_TL_DTYPE[x.dtype],
        RNE=interpreting() and x.dtype == torch.bfloat16,
        BLOCK_T=_BLOCK_T,
        BLOCK_D=_BLOCK_D,
        num_warps=4,
    )
    return out
