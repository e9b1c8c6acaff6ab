"""Hopper one-kernel fused MoE in Gluon, with the slice loop software-pipelined by hand.

Same math, rounding schedule, row-block contract and operands as `kernels_tma.fused_expert_tma_kernel`:
per row block of one flat expert, the [BM, d] activation block stays in shared memory; for each
BLOCK_I slice of the intermediate, one MMA over the slice's gate and up rows, SwiGLU7 in FP32,
one rounding to the storage dtype, then the slice feeds the down projection into a [BM, d] FP32
accumulator; x routing weight in FP32, one rounding per route.

Two entry points share that row-block body (`_row_block`):
* `fused_expert_gluon_kernel`: one program per row block of the route alignment (`align.py`).
* `fused_expert_gluon_routed_kernel`: one program per flat expert, reading that expert's route list
  (`align.expert_lists_device`, one scatter kernel instead of the alignment's four) and walking it
  in row blocks. Fewer launches for small token counts, where every expert holds about one block.

What Triton's `tl.dot` cannot express is the schedule. Triton waits for a `wgmma` as soon as its
result feeds anything but its own accumulator, so in the Triton kernels the tensor cores sit idle
while SwiGLU7 (two MUFU operations per element) runs on every slice. Here the wgmmas are issued
asynchronously and waited for explicitly: G1(i+1), the gate/up MMA of slice i+1, is issued
*before* the SwiGLU7 of slice i, so that epilogue runs under it.

Iteration i issues G1(i+1), runs SwiGLU7 on slice i (complete since iteration i-1), issues G2(i)
from it, then waits with one group outstanding. wgmma groups complete in issue order, so that wait
means G1(i+1) and everything before it (G2(i-1) included) are done: the weight buffers they read can
be refilled, and only the down-projection accumulator stays in flight across the back edge, chained
by its own wgmmas.

The SwiGLU7 slice reaches G2 through a two-slot shared-memory ring, not registers. As a register
operand, G2(i-1) would still be reading the registers that SwiGLU7(i) writes next, and ptxas then
serializes every wgmma of the kernel (a `WARPGROUP.DEPBAR` after each one in the SASS; docs/moe-notes.md
has what that cost). With the ring, the SASS keeps three waits in the whole kernel.

Weight slices arrive by TMA into rings of STAGES buffers per matrix, each with its mbarrier. The
packed bank's rows 2j, 2j+1 (gate j, up j) are row j of its [F*I, 2d] view, so each gate/up slice
is two copies, gate rows then up rows: each thread then holds adjacent SwiGLU7 outputs, which
reach shared memory by `stmatrix` (32 scalar 16-bit stores per thread and slice with the
interleaved rows; bit-equal; `docs/moe-notes.md` has the measurement).

GPU only (Hopper, a Triton with Gluon): the interpreter cannot run Gluon, so the CPU tests cover
the Triton kernels with the same contract and the GPU tests compare this one to them bit for bit.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from magi2_core.backend import SWIGLU_ALPHA, SWIGLU_LIMIT

_ALPHA = gl.constexpr(SWIGLU_ALPHA)
_LIMIT = gl.constexpr(SWIGLU_LIMIT)


@gluon.jit
def _swiglu7_slice(gu, BLOCK_M: gl.constexpr, BLOCK_I: gl.constexpr, out_dtype: gl.constexpr):
    # Gate in columns [0, BLOCK_I), up in [BLOCK_I, 2 BLOCK_I): SwiGLU7 in FP32, one rounding.
    g, u = gl.split(gl.permute(gl.reshape(gu, [BLOCK_M, 2, BLOCK_I]), (0, 2, 1)))
    g = gl.minimum(g, _LIMIT)
    u = gl.minimum(gl.maximum(u, -_LIMIT), _LIMIT)
    # g * sigmoid(ALPHA g) * (u + 1), sigmoid as 1 / (1 + exp(-x)): the Triton kernels' expression.
    s = 1.0 / (1.0 + gl.exp(-(g * _ALPHA)))
    return (g * s * (u + 1.0)).to(out_dtype)


@gluon.jit
def _load_w13(desc, bars, bufs, expert, i, s, pred, INTER: gl.constexpr, BLOCK_I: gl.constexpr):
    # Gate/up slice i of `expert` into ring slot s: gate rows first, then up rows (see the docstring).
    row = expert * INTER + i * BLOCK_I
    buf = bufs.index(s)
    mbarrier.expect(bars.index(s), 2 * desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [row, 0], bars.index(s), buf.slice(0, BLOCK_I), pred=pred)
    tma.async_copy_global_to_shared(
        desc, [row, desc.block_type.shape[1]], bars.index(s), buf.slice(BLOCK_I, BLOCK_I), pred=pred
    )


@gluon.jit
def _load_wd(desc, bars, bufs, expert, i, s, pred, INTER: gl.constexpr, BLOCK_I: gl.constexpr):
    mbarrier.expect(bars.index(s), desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [expert * INTER + i * BLOCK_I, 0], bars.index(s), bufs.index(s), pred=pred)


@gluon.jit
def _grid_dependency_wait():
    # Everything the previous kernel in the stream wrote is visible after this (PTX griddepcontrol).
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _first_slices(
    w13_desc,
    wd_desc,
    w13_bufs,
    wd_bufs,
    w13_bars,
    wd_bars,
    expert,
    INTER: gl.constexpr,
    BLOCK_I: gl.constexpr,
    STAGES: gl.constexpr,
):
    # Fresh mbarriers, then the first STAGES weight slices of `expert` on their way.
    for s in gl.static_range(STAGES):
        mbarrier.init(w13_bars.index(s), count=1)
        mbarrier.init(wd_bars.index(s), count=1)
    for s in gl.static_range(STAGES):
        _load_w13(w13_desc, w13_bars, w13_bufs, expert, s, s, True, INTER, BLOCK_I)
        _load_wd(wd_desc, wd_bars, wd_bufs, expert, s, s, True, INTER, BLOCK_I)


@gluon.jit
def _x_row_offsets(routes, valid, num_tokens, stride_xt, stride_xh, TOPK: gl.constexpr):
    # Route r = (h*T + t)*K + k reads x[t, h]: the head-major permute is folded into the gather.
    row = gl.where(valid, routes, 0) // TOPK
    head = row // num_tokens
    tok = row - head * num_tokens
    return tok.to(gl.int64) * stride_xt + head.to(gl.int64) * stride_xh


@gluon.jit
def _store_routes(acc, routes, valid, w, out_ptr, D: gl.constexpr, layout: gl.constexpr):
    # Each valid row times its routing weight w in FP32, one rounding, to its route's output row.
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    out_ptrs = out_ptr + routes.to(gl.int64)[:, None] * D + offs_d[None, :]
    gl.store(out_ptrs, (acc * w[:, None]).to(out_ptr.dtype.element_ty), mask=valid[:, None])


@gluon.jit
def _row_block(
    x_ptr,
    w13_desc,
    wd_desc,
    probs_ptr,
    out_ptr,
    ids_ptr,
    num_rows,
    expert,
    num_tokens,
    num_routes,
    stride_xt,
    stride_xh,
    a_smem,
    w13_bufs,
    wd_bufs,
    m_bufs,
    w13_bars,
    wd_bars,
    D: gl.constexpr,
    INTER: gl.constexpr,
    TOPK: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_I: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Rows ids_ptr[0:num_rows] (route numbers; >= num_routes marks padding) of one expert, start to end.

    The caller has issued the first weight slices (`_first_slices`); the mbarriers are invalidated
    before returning, so a program may do several row blocks in turn with the same shared memory.
    """
    NUM_SLICES: gl.constexpr = INTER // BLOCK_I
    dtype: gl.constexpr = w13_desc.dtype
    # Layouts: the row gather loads 16 B per thread along d; both MMAs put the warps along M.
    load_layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    mma1: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, 2 * BLOCK_I, 16]
    )
    mma2: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, D, 16]
    )

    offs_m_l = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, load_layout))
    routes_l = gl.load(ids_ptr + offs_m_l, mask=offs_m_l < num_rows, other=num_routes)
    valid_l = routes_l < num_routes
    a_row = _x_row_offsets(routes_l, valid_l, num_tokens, stride_xt, stride_xh, TOPK)
    offs_d_l = gl.arange(0, D, layout=gl.SliceLayout(0, load_layout))
    a = gl.load(x_ptr + a_row[:, None] + offs_d_l[None, :], mask=valid_l[:, None], other=0.0)
    a_smem.store(a)
    fence_async_shared()

    zero1 = gl.zeros([BLOCK_M, 2 * BLOCK_I], gl.float32, layout=mma1)
    acc = warpgroup_mma_init(gl.zeros([BLOCK_M, D], gl.float32, layout=mma2))
    mbarrier.wait(w13_bars.index(0), 0)
    gu = warpgroup_mma(a_smem, w13_bufs.index(0).permute((1, 0)), zero1, use_acc=False, is_async=True)
    gu = warpgroup_mma_wait(num_outstanding=0, deps=(gu,))
    for i in range(0, NUM_SLICES - 1):
        # G1(i) finished before this iteration (in the last one, or before the loop for i = 0):
        # its buffer takes slice i + STAGES.
        refill = i + STAGES < NUM_SLICES
        _load_w13(w13_desc, w13_bars, w13_bufs, expert, i + STAGES, i % STAGES, refill, INTER, BLOCK_I)
        s1 = (i + 1) % STAGES
        mbarrier.wait(w13_bars.index(s1), ((i + 1) // STAGES) & 1)
        gu_next = warpgroup_mma(a_smem, w13_bufs.index(s1).permute((1, 0)), zero1, use_acc=False, is_async=True)
        # SwiGLU7 writes the other slot of the ring that G2(i-1), still in flight, reads from.
        m_smem = m_bufs.index(i % 2)
        m_smem.store(_swiglu7_slice(gu, BLOCK_M, BLOCK_I, dtype))
        fence_async_shared()
        sd = i % STAGES
        mbarrier.wait(wd_bars.index(sd), (i // STAGES) & 1)
        acc = warpgroup_mma(m_smem, wd_bufs.index(sd), acc, is_async=True)
        gu = warpgroup_mma_wait(num_outstanding=1, deps=(gu_next,))
        # G2(i-1) is done too (issued before G1(i+1)): its buffer takes slice i - 1 + STAGES.
        refill = (i >= 1) & (i - 1 + STAGES < NUM_SLICES)
        _load_wd(wd_desc, wd_bars, wd_bufs, expert, i - 1 + STAGES, (i + STAGES - 1) % STAGES, refill, INTER, BLOCK_I)
    LAST: gl.constexpr = NUM_SLICES - 1
    m_smem = m_bufs.index(LAST % 2)
    m_smem.store(_swiglu7_slice(gu, BLOCK_M, BLOCK_I, dtype))
    fence_async_shared()
    mbarrier.wait(wd_bars.index(LAST % STAGES), (LAST // STAGES) & 1)
    acc = warpgroup_mma(m_smem, wd_bufs.index(LAST % STAGES), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(w13_bars.index(s))
        mbarrier.invalidate(wd_bars.index(s))

    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma2))
    routes = gl.load(ids_ptr + offs_m, mask=offs_m < num_rows, other=num_routes)
    valid = routes < num_routes
    w = gl.load(probs_ptr + routes, mask=valid, other=0.0)
    _store_routes(acc, routes, valid, w, out_ptr, D, mma2)


@gluon.jit
def _shared(w13_desc, wd_desc, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_I: gl.constexpr, STAGES: gl.constexpr):
    dtype: gl.constexpr = w13_desc.dtype
    a_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype))
    w13_bufs = gl.allocate_shared_memory(dtype, [STAGES, 2 * BLOCK_I, D], w13_desc.layout)
    wd_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_I, D], wd_desc.layout)
    m_bufs = gl.allocate_shared_memory(
        dtype, [2, BLOCK_M, BLOCK_I], gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_I], dtype)
    )
    w13_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    wd_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    return a_smem, w13_bufs, wd_bufs, m_bufs, w13_bars, wd_bars


@gluon.jit
def fused_expert_gluon_kernel(
    x_ptr,  # [T, Hl, d]
    w13_desc,  # packed bank as [F*I, 2d] (row j: gate j, up j), block [BLOCK_I, d]
    wd_desc,  # w_down as [F*I, d], block [BLOCK_I, d]
    probs_ptr,  # [R] fp32 routing weights, flat route order
    out_ptr,  # [R, d] per-route outputs
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    num_tokens,
    num_routes,
    stride_xt,
    stride_xh,
    D: gl.constexpr,
    INTER: gl.constexpr,
    TOPK: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_I: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    """One program per row block of the route alignment (sorted ids padded with the sentinel R)."""
    gl.static_assert(INTER % BLOCK_I == 0)
    gl.static_assert(INTER // BLOCK_I >= 3)
    gl.static_assert(STAGES >= 2)
    blk = gl.program_id(0)
    if blk * BLOCK_M < gl.load(num_padded_ptr):
        a_smem, w13_bufs, wd_bufs, m_bufs, w13_bars, wd_bars = _shared(w13_desc, wd_desc, D, BLOCK_M, BLOCK_I, STAGES)
        expert = gl.load(expert_ids_ptr + blk)
        # Weight slices first: their latency hides under the activation gather. The block's expert and
        # the padded count come from alignment kernels that finished before the last one (the
        # scatter of the route ids) started; launched with programmatic dependent launch, this
        # kernel overlaps that scatter until the wait (a no-op in a plain launch).
        _first_slices(w13_desc, wd_desc, w13_bufs, wd_bufs, w13_bars, wd_bars, expert, INTER, BLOCK_I, STAGES)
        _grid_dependency_wait()
        _row_block(
            x_ptr,
            w13_desc,
            wd_desc,
            probs_ptr,
            out_ptr,
            sorted_ids_ptr + blk * BLOCK_M,
            BLOCK_M,
            expert,
            num_tokens,
            num_routes,
            stride_xt,
            stride_xh,
            a_smem,
            w13_bufs,
            wd_bufs,
            m_bufs,
            w13_bars,
            wd_bars,
            D,
            INTER,
            TOPK,
            BLOCK_M,
            BLOCK_I,
            STAGES,
            num_warps,
        )


@gluon.jit
def fused_expert_gluon_routed_kernel(
    x_ptr,  # [T, Hl, d]
    w13_desc,  # packed bank as [F*I, 2d] (row j: gate j, up j), block [BLOCK_I, d]
    wd_desc,  # w_down as [F*I, d], block [BLOCK_I, d]
    probs_ptr,  # [R] fp32 routing weights, flat route order
    out_ptr,  # [R, d] per-route outputs
    lists_ptr,  # [F, list_stride] int32: expert f's routes in lists[f, 0:counts[f]]
    counts_ptr,  # [F] int32
    list_stride,
    num_tokens,
    num_routes,
    stride_xt,
    stride_xh,
    D: gl.constexpr,
    INTER: gl.constexpr,
    TOPK: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_I: gl.constexpr,
    STAGES: gl.constexpr,
    num_warps: gl.constexpr,
):
    """One program per flat expert: its route list in row blocks of BLOCK_M, one after another."""
    gl.static_assert(INTER % BLOCK_I == 0)
    gl.static_assert(INTER // BLOCK_I >= 3)
    gl.static_assert(STAGES >= 2)
    expert = gl.program_id(0)
    a_smem, w13_bufs, wd_bufs, m_bufs, w13_bars, wd_bars = _shared(w13_desc, wd_desc, D, BLOCK_M, BLOCK_I, STAGES)
    # The expert is the program id, so its first weight slices go out before the route lists are
    # read. Launched with programmatic dependent launch, this overlaps the list kernel still running:
    # griddepcontrol.wait then waits for it (and is a no-op in a plain launch).
    _first_slices(w13_desc, wd_desc, w13_bufs, wd_bufs, w13_bars, wd_bars, expert, INTER, BLOCK_I, STAGES)
    _grid_dependency_wait()
    count = gl.load(counts_ptr + expert)
    if count == 0:  # rare: let the copies land in memory this program still owns, then leave
        for s in gl.static_range(STAGES):
            mbarrier.wait(w13_bars.index(s), 0)
            mbarrier.wait(wd_bars.index(s), 0)
            mbarrier.invalidate(w13_bars.index(s))
            mbarrier.invalidate(wd_bars.index(s))
    else:
        ids_ptr = lists_ptr + expert.to(gl.int64) * list_stride
        for start in range(0, count, BLOCK_M):
            if start > 0:
                _first_slices(w13_desc, wd_desc, w13_bufs, wd_bufs, w13_bars, wd_bars, expert, INTER, BLOCK_I, STAGES)
            _row_block(
                x_ptr,
                w13_desc,
                wd_desc,
                probs_ptr,
                out_ptr,
                ids_ptr + start,
                count - start,
                expert,
                num_tokens,
                num_routes,
                stride_xt,
                stride_xh,
                a_smem,
                w13_bufs,
                wd_bufs,
                m_bufs,
                w13_bars,
                wd_bars,
                D,
                INTER,
                TOPK,
                BLOCK_M,
                BLOCK_I,
                STAGES,
                num_warps,
            )
