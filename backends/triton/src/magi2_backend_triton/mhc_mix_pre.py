"""Fused ``mhc_mix_pre`` (operators.md §5.4): the next branch's logits formed while the new streams are written.

For BF16 streams, two launches over the streams (after the small one that splits the folded weight):

1. the mix and the logits: each program owns a tile of tokens (of one modality group) and a chunk of the
   stream width, for all ``n`` streams. Per step it forms the new streams as ``mhc_mix`` does (the
   residual mix accumulated in FP32 from the ``n`` input streams, the post term, each rounded to BF16,
   their rounded sum), stores them, and feeds the same BF16 values to the next branch's logits: their
   FP32 sum of squares and three BF16 tensor-core dots against the folded, split weight, as ``mhc_pre``'s
   logits kernel does with the streams it reads. The new streams are never read back for the logits;
2. ``mhc_pre``'s apply kernel on the new streams (the chunks' sums in a fixed order, the coefficients,
   the branch input).

Other dtypes are not exact in BF16, so their logits take ``mhc_pre``'s FP32 dot: they run the two ops'
kernels one after the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from magi2_backend_triton.interpret import interpreting
from magi2_backend_triton.mhc_mix import launch_mhc_mix
from magi2_backend_triton.mhc_pre import _MOD_PER_LAUNCH, _cast, _rounded, launch_apply, launch_mhc_pre, split_pieces

if TYPE_CHECKING:
    from magi2_core.backend import MHCMixPreCall

__all__ = ["MIX_PRE", "MixPreConfig", "launch_mhc_mix_pre"]


@dataclass(frozen=True)
class MixPreConfig:
    """The fused kernel's launch: tokens per tile (``tl.dot`` needs at least 16), stream channels per step
    (the dots' K step; at least 16), warps, pipeline stages and the chunks the stream width is split into
    (each writes its own partial logits, summed in order afterwards)."""

    block_t: int = 64
    block_d: int = 64
    num_warps: int = 4
    num_stages: int = 2
    split_d: int = 1

    def __post_init__(self) -> None:
        if not all(v >= 16 and v & (v - 1) == 0 for v in (self.block_t, self.block_d)):
            raise ValueError(f"MixPreConfig: block_t and block_d must be powers of two >= 16, got {self}")
        if self.split_d < 1:
            raise ValueError(f"MixPreConfig: split_d must be >= 1, got {self}")


MIX_PRE = MixPreConfig()


@triton.jit(do_not_specialize=["T", "o1", "o2", "o3", "c1", "c2", "c3"])
def _mhc_mix_logits_kernel(
    x_ptr,
    y_ptr,
    p_ptr,
    r_ptr,
    o_ptr,
    pc_ptr,
    part_ptr,
    sq_ptr,
    T,
    NL,
    stride_xt,
    stride_xn,
    stride_yt,
    stride_pt,
    stride_pn,
    stride_rt,
    stride_ri,
    stride_rj,
    stride_part,
    stride_sq,
    o1,
    o2,
    o3,
    c1,
    c2,
    c3,
    N: tl.constexpr,
    D: tl.constexpr,
    D_CHUNK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    RNE: tl.constexpr,
):
    """Program ``(tile, chunk)``: the tile's group and rows as in ``mhc_pre``'s split logits kernel; the
    chunk's channels of all ``N`` new streams written to ``o_ptr``, its unscaled logit sums to
    ``part[chunk]`` and its sums of squares to ``sq[chunk]`` (``pc_ptr`` = ``[groups, 3, N·D, BLOCK_N]``).
    Each output stream is a 2-D ``[BLOCK_T, BLOCK_D]`` tile: formed from the ``N`` input streams' tiles
    (read again for each output stream: from L1 after the first), stored, and fed to the dots."""
    tile = tl.program_id(0)
    chunk = tl.program_id(1)
    g = (tile >= c1).to(tl.int32) + (tile >= c2).to(tl.int32) + (tile >= c3).to(tl.int32)
    first_tile = tl.where(g == 0, 0, tl.where(g == 1, c1, tl.where(g == 2, c2, c3)))
    start = tl.where(g == 0, 0, tl.where(g == 1, o1, tl.where(g == 2, o2, o3)))
    end = tl.where(g == 0, o1, tl.where(g == 1, o2, tl.where(g == 2, o3, T)))
    rows = start.to(tl.int64) + (tile - first_tile).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < end
    cols = tl.arange(0, BLOCK_N)
    pieces = pc_ptr + g.to(tl.int64) * (3 * N * D * BLOCK_N)
    acc_hi = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    acc_mid = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    acc_lo = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    sumsq = tl.zeros((BLOCK_T,), tl.float32)
    for d0 in range(0, D_CHUNK, BLOCK_D):  # compile-time bounds (older interpreters need them)
        cs = chunk * D_CHUNK + d0 + tl.arange(0, BLOCK_D)
        c_ok = cs < D
        tc = row_ok[:, None] & c_ok[None, :]
        y = tl.load(y_ptr + rows[:, None] * stride_yt + cs[None, :], mask=tc, other=0.0).to(tl.float32)
        for i in tl.static_range(N):
            mixed = tl.zeros((BLOCK_T, BLOCK_D), tl.float32)
            for j in tl.static_range(N):
                xj = tl.load(x_ptr + rows[:, None] * stride_xt + j * stride_xn + cs[None, :], mask=tc, other=0.0)
                rij = tl.load(r_ptr + rows * stride_rt + i * stride_ri + j * stride_rj, mask=row_ok, other=0.0)
                mixed += rij.to(tl.float32)[:, None] * xj.to(tl.float32)
            pi = tl.load(p_ptr + rows * stride_pt + i * stride_pn, mask=row_ok, other=0.0).to(tl.float32)
            new = _rounded(mixed, tl.bfloat16, RNE) + _rounded(pi[:, None] * y, tl.bfloat16, RNE)
            new = _cast(tl.where(tc, new, 0.0), tl.bfloat16, RNE)  # masked lanes zero for the dots
            tl.store(o_ptr + rows[:, None] * (N * D) + i * D + cs[None, :], new, mask=tc)
            nf = new.to(tl.float32)
            sumsq += tl.sum(nf * nf, axis=1)
            piece = pieces + (i * D + cs)[:, None] * BLOCK_N + cols[None, :]  # rows i·D + c of the split weight
            hi = tl.load(piece, mask=c_ok[:, None], other=0.0)
            mid = tl.load(piece + N * D * BLOCK_N, mask=c_ok[:, None], other=0.0)
            lo = tl.load(piece + 2 * N * D * BLOCK_N, mask=c_ok[:, None], other=0.0)
            if UPCAST:  # the interpreter multiplies the raw bits of BF16 dot operands: hand it FP32 values
                acc_hi += tl.dot(nf, hi.to(tl.float32), input_precision="ieee")
                acc_mid += tl.dot(nf, mid.to(tl.float32), input_precision="ieee")
                acc_lo += tl.dot(nf, lo.to(tl.float32), input_precision="ieee")
            else:
                acc_hi = tl.dot(new, hi, acc_hi)
                acc_mid = tl.dot(new, mid, acc_mid)
                acc_lo = tl.dot(new, lo, acc_lo)
    acc = (acc_lo + acc_mid) + acc_hi
    out = part_ptr + chunk.to(tl.int64) * stride_part + rows[:, None] * NL + cols[None, :]
    tl.store(out, acc, mask=row_ok[:, None] & (cols < NL)[None, :])
    tl.store(sq_ptr + chunk.to(tl.int64) * stride_sq + rows, sumsq, mask=row_ok)


def launch_mhc_mix_pre(
    call: MHCMixPreCall, config: MixPreConfig = MIX_PRE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the kernels for a validated call; returns ``(new streams, branch_input, post, residual)``."""
    x = call.streams
    if x.dtype != torch.bfloat16:
        new = launch_mhc_mix(call.mix_call())
        return (new, *launch_mhc_pre(call.pre_call(new)))
    x = x if x.stride(2) == 1 else x.contiguous()
    y = call.branch_output if call.branch_output.stride(1) == 1 else call.branch_output.contiguous()
    p, r = call.post, call.residual
    t, n, d = x.shape
    new = torch.empty((t, n, d), dtype=x.dtype, device=x.device)
    pre = call.pre_call(new)
    if t == 0:
        return (new, *launch_apply(pre, new, None, None, 0))
    nl = 2 * n + n * n
    block_n = max(16, triton.next_power_of_2(nl))
    pieces = split_pieces(call.norm_weight.contiguous(), call.phi.contiguous(), block_n)
    cfg = config
    parts = torch.empty((cfg.split_d, t, nl), dtype=torch.float32, device=x.device)
    sumsq = torch.empty((cfg.split_d, t), dtype=torch.float32, device=x.device)
    d_chunk = triton.cdiv(triton.cdiv(d, cfg.split_d), cfg.block_d) * cfg.block_d
    sizes = [t] if call.modality_sizes is None else list(call.modality_sizes)
    interp = interpreting()
    t0 = 0
    for g0 in range(0, len(sizes), _MOD_PER_LAUNCH):
        group = (sizes[g0 : g0 + _MOD_PER_LAUNCH] + [0] * _MOD_PER_LAUNCH)[:_MOD_PER_LAUNCH]  # padded to four
        starts = [sum(group[:k]) for k in range(1, _MOD_PER_LAUNCH)]
        tiles = [sum(triton.cdiv(s, cfg.block_t) for s in group[:k]) for k in range(1, _MOD_PER_LAUNCH + 1)]
        size = sum(group)
        if size:
            _mhc_mix_logits_kernel[(tiles[-1], cfg.split_d)](
                x[t0:],
                y[t0:],
                p[t0:],
                r[t0:],
                new[t0:],
                pieces[g0:],
                parts[:, t0:],
                sumsq[:, t0:],
                size,
                nl,
                x.stride(0),
                x.stride(1),
                y.stride(0),
                p.stride(0),
                p.stride(1),
                r.stride(0),
                r.stride(1),
                r.stride(2),
                parts.stride(0),
                sumsq.stride(0),
                *starts,
                *tiles[:-1],
                N=n,
                D=d,
                D_CHUNK=d_chunk,
                BLOCK_T=cfg.block_t,
                BLOCK_D=cfg.block_d,
                BLOCK_N=block_n,
                UPCAST=interp,
                RNE=interp,
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
            )
        t0 += size
    return (new, *launch_apply(pre, new, parts, sumsq, cfg.split_d))
