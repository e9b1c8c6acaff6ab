"""Triton kernels of the fused MoE: GEMM1 + SwiGLU7, GEMM2 + routing weight, top-k sum.

Rows are "slots" of the aligned route list (see align.py): slot s holds route r = sorted_ids[s]
(or the sentinel R), and every row block belongs to one flat expert expert_ids[block]. Blocks
at or past the padded count exit at once, so the grid can be sized from the host-side upper bound.

Activations and weights are BF16, FP16 or FP32 (one dtype per call); every rounding named by the
contract is a cast to that dtype (the identity for FP32), accumulators are FP32.

Two Triton-interpreter traps are handled by constexpr flags set only under TRITON_INTERPRET=1:
UPCAST_DOT (the interpreter multiplies raw bf16 bits in tl.dot; fp32 operands are exact since
bf16 products fit in fp32) and EXPLICIT_RNE (its fp32->bf16 cast truncates; we round to nearest
even by hand first so the stored bf16 values match the GPU's). UPCAST_DOT is also set for FP32
activations on the GPU: it selects IEEE FP32 dots, where the default would be TF32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from magi2_core.backend import SWIGLU_ALPHA as CONTRACT_ALPHA
from magi2_core.backend import SWIGLU_LIMIT as CONTRACT_LIMIT

from ..bf16 import rne_bf16_bits

# SwiGLU7's constants from the operator contract, as compile-time constants of the kernels.
SWIGLU_ALPHA: tl.constexpr = tl.constexpr(CONTRACT_ALPHA)
SWIGLU_LIMIT: tl.constexpr = tl.constexpr(CONTRACT_LIMIT)


@triton.jit
def _rne(x, EXPLICIT_RNE: tl.constexpr):
    # FP32 rounded to the nearest BF16 value (ties to even), still as FP32; the caller's cast to the
    # storage dtype is then exact. Only set for BF16 outputs under the interpreter.
    if EXPLICIT_RNE:
        x = rne_bf16_bits(x).to(tl.float32, bitcast=True)
    return x


@triton.jit
def _swiglu7(g, u):
    # SwiGLU7 in FP32: gate clamped above at 7, up clamped to [-7, 7], g*sigmoid(1.702 g)*(u+1).
    g = tl.minimum(g, SWIGLU_LIMIT)
    u = tl.minimum(tl.maximum(u, -SWIGLU_LIMIT), SWIGLU_LIMIT)
    # g * ALPHA, not ALPHA * g: a constexpr on the left of a product breaks Triton 3.9's interpreter
    return g * tl.sigmoid(g * SWIGLU_ALPHA) * (u + 1.0)


@triton.jit
def _block_coords(pid, num_blocks_m, num_blocks_n, GROUP_M: tl.constexpr):
    # Grouped order: GROUP_M consecutive row blocks (a few experts) sweep all column tiles
    # together, so each expert's weight tile is fetched from HBM once and re-read from L2.
    group_size = GROUP_M * num_blocks_n
    group = pid // group_size
    first_m = group * GROUP_M
    rows_in_group = tl.minimum(num_blocks_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % rows_in_group
    pid_n = (pid % group_size) // rows_in_group
    return pid_m, pid_n


@triton.jit
def gemm1_swiglu7_kernel(
    x_ptr,  # [T, Hl, d] bf16
    wg_ptr,  # gate weights, element (f, k, n) at f*stride_wf + k*stride_wk + n*stride_wn
    wu_ptr,  # up weights, same strides
    inter_ptr,  # [capacity, I] bf16, indexed by slot
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_tokens,
    num_routes,
    num_blocks_m,
    stride_xt,
    stride_xh,
    stride_wf,
    stride_wk,
    stride_wn,
    D: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    EXPLICIT_RNE: tl.constexpr,
):
    pid_m, pid_n = _block_coords(tl.program_id(0), num_blocks_m, tl.cdiv(INTER, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    slots = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    routes = tl.load(sorted_ids_ptr + slots)
    valid = routes < num_routes
    # Route r = (h*T + t)*K + k reads x[t, h]: the head-major permute is folded into the gather.
    row = tl.where(valid, routes, 0) // TOPK
    head = row // num_tokens
    tok = row - head * num_tokens
    a_row = tok.to(tl.int64) * stride_xt + head.to(tl.int64) * stride_xh
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < INTER
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + a_row[:, None] + offs_k[None, :]
    w_off = expert * stride_wf + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    g_ptrs = wg_ptr + w_off
    u_ptrs = wu_ptr + w_off
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        mask_k = offs_k < D - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & mask_k[None, :], other=0.0)
        bg = tl.load(g_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        bu = tl.load(u_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if UPCAST_DOT:
            a32 = a.to(tl.float32)
            acc_g = tl.dot(a32, bg.to(tl.float32), acc_g, input_precision="ieee")
            acc_u = tl.dot(a32, bu.to(tl.float32), acc_u, input_precision="ieee")
        else:
            acc_g = tl.dot(a, bg, acc_g)
            acc_u = tl.dot(a, bu, acc_u)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K * stride_wk
        u_ptrs += BLOCK_K * stride_wk

    m = _swiglu7(acc_g, acc_u)
    out_ptrs = inter_ptr + slots.to(tl.int64)[:, None] * INTER + offs_n[None, :]
    tl.store(out_ptrs, _rne(m, EXPLICIT_RNE).to(inter_ptr.dtype.element_ty), mask=valid[:, None] & mask_n[None, :])


@triton.jit
def gemm2_weighted_kernel(
    inter_ptr,  # [capacity, I] bf16, indexed by slot
    wd_ptr,  # [F, I, d] bf16, contiguous
    probs_ptr,  # [R] fp32 routing weights, flat route order
    out_ptr,  # [R, d] bf16 per-route outputs
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_routes,
    num_blocks_m,
    D: tl.constexpr,
    INTER: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    EXPLICIT_RNE: tl.constexpr,
):
    pid_m, pid_n = _block_coords(tl.program_id(0), num_blocks_m, tl.cdiv(D, BLOCK_N), GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    slots = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    routes = tl.load(sorted_ids_ptr + slots)
    valid = routes < num_routes
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < D
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = inter_ptr + slots.to(tl.int64)[:, None] * INTER + offs_k[None, :]
    b_ptrs = wd_ptr + expert * INTER * D + offs_k[:, None] * D + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        mask_k = offs_k < INTER - k0
        a = tl.load(a_ptrs, mask=valid[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if UPCAST_DOT:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K * D

    # Routing weight applied to the FP32 accumulator, then one BF16 rounding per route.
    w = tl.load(probs_ptr + routes, mask=valid, other=0.0)
    r = acc * w[:, None]
    out_ptrs = out_ptr + routes.to(tl.int64)[:, None] * D + offs_n[None, :]
    tl.store(out_ptrs, _rne(r, EXPLICIT_RNE).to(out_ptr.dtype.element_ty), mask=valid[:, None] & mask_n[None, :])


@triton.jit
def topk_sum_kernel(
    routed_ptr,  # [Hl*T*K, d] bf16, row (h*T + t)*K + k
    y_ptr,  # [T, Hl, d] bf16
    num_rows,  # Hl*T
    num_tokens,
    stride_yt,
    stride_yh,
    D: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    EXPLICIT_RNE: tl.constexpr,
):
    # Sum of the K BF16 route outputs in FP32, k in order, one cast; writes token-major y
    # directly, folding the head-major -> token-major permute into the store.
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (rows < num_rows)[:, None] & (offs_d < D)[None, :]
    src = routed_ptr + rows.to(tl.int64)[:, None] * (TOPK * D) + offs_d[None, :]
    acc = tl.zeros((BLOCK_R, BLOCK_D), dtype=tl.float32)
    for k in tl.static_range(TOPK):
        acc += tl.load(src + k * D, mask=mask, other=0.0).to(tl.float32)
    head = rows // num_tokens
    tok = rows - head * num_tokens
    dst = y_ptr + tok.to(tl.int64)[:, None] * stride_yt + head.to(tl.int64)[:, None] * stride_yh + offs_d[None, :]
    tl.store(dst, _rne(acc, EXPLICIT_RNE).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def fused_expert_kernel(
    x_ptr,  # [T, Hl, d] bf16
    wg_ptr,  # gate weights, element (f, k, n) at f*stride_wf + k*stride_wk + n*stride_wn
    wu_ptr,  # up weights, same strides
    wd_ptr,  # [F, I, d] bf16, contiguous
    probs_ptr,  # [R] fp32 routing weights, flat route order
    out_ptr,  # [R, d] bf16 per-route outputs
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_tokens,
    num_routes,
    stride_xt,
    stride_xh,
    stride_wf,
    stride_wk,
    stride_wn,
    D: tl.constexpr,
    INTER: tl.constexpr,
    TOPK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_I: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    EXPLICIT_RNE: tl.constexpr,
):
    # Both GEMMs in one program, like an attention forward: the [BM, d] activation block stays
    # on chip, each BLOCK_I slice of the intermediate is produced (gate/up dots + SwiGLU7, rounded
    # to BF16 as the contract says) and consumed by the down projection at once. The intermediate
    # never touches HBM and each expert's three weight matrices stream through exactly once per
    # row block. Needs d to be a power of two (the whole row is one tile).
    pid_m = tl.program_id(0)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    slots = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    routes = tl.load(sorted_ids_ptr + slots)
    valid = routes < num_routes
    row = tl.where(valid, routes, 0) // TOPK
    head = row // num_tokens
    tok = row - head * num_tokens
    a_row = tok.to(tl.int64) * stride_xt + head.to(tl.int64) * stride_xh
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_d = tl.arange(0, D)
    offs_i = tl.arange(0, BLOCK_I)
    a = tl.load(x_ptr + a_row[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
    if UPCAST_DOT:
        a = a.to(tl.float32)
    if INTERLEAVED:
        # Packed bank read as one [d, 2*BLOCK_I] tile: one dot of twice the width, then the
        # (gate, up) column pairs are split apart in registers.
        offs_j = tl.arange(0, 2 * BLOCK_I)
        w_off = expert * stride_wf + offs_d[:, None] * stride_wk + offs_j[None, :] * (stride_wn // 2)
    else:
        w_off = expert * stride_wf + offs_d[:, None] * stride_wk + offs_i[None, :] * stride_wn
    g_ptrs = wg_ptr + w_off
    u_ptrs = wu_ptr + w_off
    d_ptrs = wd_ptr + expert * INTER * D + offs_i[:, None] * D + offs_d[None, :]
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    for _ in range(0, INTER, BLOCK_I):
        if INTERLEAVED:
            bgu = tl.load(g_ptrs)
            if UPCAST_DOT:
                gu = tl.dot(a, bgu.to(tl.float32), input_precision="ieee")
            else:
                gu = tl.dot(a, bgu)
            g, u = tl.split(tl.reshape(gu, (BLOCK_M, BLOCK_I, 2)))
        else:
            bg = tl.load(g_ptrs)
            bu = tl.load(u_ptrs)
            if UPCAST_DOT:
                g = tl.dot(a, bg.to(tl.float32), input_precision="ieee")
                u = tl.dot(a, bu.to(tl.float32), input_precision="ieee")
            else:
                g = tl.dot(a, bg)
                u = tl.dot(a, bu)
        m = _rne(_swiglu7(g, u), EXPLICIT_RNE).to(wd_ptr.dtype.element_ty)
        bd = tl.load(d_ptrs)
        if UPCAST_DOT:
            acc = tl.dot(m.to(tl.float32), bd.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(m, bd, acc)
        g_ptrs += BLOCK_I * stride_wn
        u_ptrs += BLOCK_I * stride_wn
        d_ptrs += BLOCK_I * D

    w = tl.load(probs_ptr + routes, mask=valid, other=0.0)
    out_ptrs = out_ptr + routes.to(tl.int64)[:, None] * D + offs_d[None, :]
    tl.store(out_ptrs, _rne(acc * w[:, None], EXPLICIT_RNE).to(out_ptr.dtype.element_ty), mask=valid[:, None])
