"""Hopper variants of the one-kernel fused MoE: weight tiles through tensor descriptors (TMA).

Same math, rounding schedule and row-block contract as `kernels.fused_expert_kernel` (see there):
per row block of one flat expert, the [BM, d] activation block stays on chip; for each BLOCK_I
slice of the intermediate, one dot over the interleaved (gate, up) bank, SwiGLU7 in FP32, one
rounding to the storage dtype, then the slice feeds the down projection into a [BM, d] FP32
accumulator; x routing weight in FP32, one rounding per route.

What changes is how the weights arrive. The `one_kernel` variant computes a [d, 2*BLOCK_I] tile of
64-bit addresses per slice (registers and integer work next to the MMAs); here each slice is one
bulk copy per matrix through a host-built tensor descriptor, issued by the TMA unit straight into
swizzled shared memory. (Warp-specialised and persistent schedules of this kernel were measured
and gave no gain, docs/moe-notes.md; git history keeps them.)

The activation rows are a gather (one route per row), which Hopper's TMA cannot do; they keep
pointer loads, once per row block.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernels import _rne, _swiglu7


@triton.jit
def _expert_block(
    blk,
    x_ptr,
    w13_desc,
    wd_desc,
    probs_ptr,
    out_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_tokens,
    num_routes,
    stride_xt,
    stride_xh,
    D: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_I: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    EXPLICIT_RNE: tl.constexpr,
):
    slots = blk * BLOCK_M + tl.arange(0, BLOCK_M)
    routes = tl.load(sorted_ids_ptr + slots)
    valid = routes < num_routes
    # Route r = (h*T + t)*K + k reads x[t, h]: the head-major permute is folded into the gather.
    row = tl.where(valid, routes, 0) // TOPK
    head = row // num_tokens
    tok = row - head * num_tokens
    a_row = tok.to(tl.int64) * stride_xt + head.to(tl.int64) * stride_xh
    expert = tl.load(expert_ids_ptr + blk)
    offs_d = tl.arange(0, D)
    a = tl.load(x_ptr + a_row[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
    if UPCAST_DOT:
        a = a.to(tl.float32)
    # Descriptor rows: the bank is [F*2I, d] (row 2i gate, 2i+1 up of channel i), w_down [F*I, d].
    w13_row = expert * (2 * INTER)
    wd_row = expert * INTER
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    for i0 in tl.range(0, INTER, BLOCK_I):
        bgu = w13_desc.load([w13_row + 2 * i0, 0])  # [2*BLOCK_I, d], K-contiguous rows
        if UPCAST_DOT:
            gu = tl.dot(a, bgu.to(tl.float32).T, input_precision="ieee")
        else:
            gu = tl.dot(a, bgu.T)
        g, u = tl.split(tl.reshape(gu, (BLOCK_M, BLOCK_I, 2)))
        m = _rne(_swiglu7(g, u), EXPLICIT_RNE).to(out_ptr.dtype.element_ty)
        bd = wd_desc.load([wd_row + i0, 0])  # [BLOCK_I, d]
        if UPCAST_DOT:
            acc = tl.dot(m.to(tl.float32), bd.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(m, bd, acc)

    w = tl.load(probs_ptr + routes, mask=valid, other=0.0)
    out_ptrs = out_ptr + routes.to(tl.int64)[:, None] * D + offs_d[None, :]
    tl.store(out_ptrs, _rne(acc * w[:, None], EXPLICIT_RNE).to(out_ptr.dtype.element_ty), mask=valid[:, None])


@triton.jit
def fused_expert_tma_kernel(
    x_ptr,  # [T, Hl, d]
    w13_desc,  # descriptor over the packed bank as [F*2I, d], block [2*BLOCK_I, d]
    wd_desc,  # descriptor over w_down as [F*I, d], block [BLOCK_I, d]
    probs_ptr,  # [R] fp32 routing weights, flat route order
    out_ptr,  # [R, d] per-route outputs
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_tokens,
    num_routes,
    stride_xt,
    stride_xh,
    D: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_I: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    EXPLICIT_RNE: tl.constexpr,
):
    blk = tl.program_id(0)
    if blk * BLOCK_M < tl.load(num_padded_ptr):
        _expert_block(
            blk,
            x_ptr,
            w13_desc,
            wd_desc,
            probs_ptr,
            out_ptr,
            sorted_ids_ptr,
            expert_ids_ptr,
            num_tokens,
            num_routes,
            stride_xt,
            stride_xh,
            D,
            INTER,
            TOPK,
            BLOCK_M,
            BLOCK_I,
            UPCAST_DOT,
            EXPLICIT_RNE,
        )
