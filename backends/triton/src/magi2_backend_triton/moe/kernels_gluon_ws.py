"""The Gluon fused MoE, persistent and warp-specialised: one loader warp, two 64-row consumers.

Same math, rounding schedule, operands and row-block contract as `kernels_gluon.fused_expert_gluon_kernel`
(aligned 128-row blocks), and the same per-slice schedule inside each consumer: G1(i+1) is issued
before SwiGLU7 of slice i, G2(i) after it, then a wait with one group in flight.

What changes is who waits for whom. In the 8-warp kernel both warpgroups share one instruction
stream: every SwiGLU7 slice written to shared memory is followed by a barrier of the whole block,
so the two warpgroups run in lockstep, run their activation math at the same moments and leave the
tensor cores idle together (so SwiGLU7's arithmetic does not hide under the MMAs: the ablation in
docs/moe-notes.md). Here:

* a one-warp loader partition streams the weight slices by TMA into STAGES-deep rings, each slot
  with a "full" mbarrier (TMA bytes) and an "empty" mbarrier (count 2: one arrival per consumer
  once its MMAs that read the slot are done);
* two 4-warp consumer partitions each own 64 rows of the block (own activation buffer, own SwiGLU7
  ring), and synchronise only within themselves and through the slot mbarriers, so one's SwiGLU7
  can run while the other's MMAs hold the tensor cores;
* the grid is one program per SM walking blocks p, p + grid, ...: the loader's ring runs on into
  the next block's first slices, and each consumer gathers its next rows by cp.async as soon as its
  last gate/up MMA of a block is done, under that block's last slice, down projection and store
  (in the 8-warp kernel nothing overlaps the gather and the store).

Shared memory is the 8-warp kernel's (the same buffers, split per consumer) plus an "empty" mbarrier
per weight buffer. Bit-equal to the 8-warp kernel; docs/moe-notes.md has the timings of both.
GPU only (Hopper, a Triton with Gluon's warp specialisation).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

from .kernels_gluon import (
    _grid_dependency_wait,
    _load_w13,
    _load_wd,
    _store_routes,
    _swiglu7_slice,
    _x_row_offsets,
)

_ROWS = gl.constexpr(64)  # rows per consumer: one wgmma M
_CONSUMER_WARPS = gl.constexpr(4)  # one warpgroup


@gluon.jit
def _ws_loader(
    w13_desc,
    wd_desc,
    w13_bufs,
    wd_bufs,
    w13_full,
    wd_full,
    w13_empty,
    wd_empty,
    expert_ids_ptr,
    num_blocks,
    INTER: gl.constexpr,
    BLOCK_I: gl.constexpr,
    STAGES: gl.constexpr,
):
    # The program's blocks in turn, every slice of each: global slice n goes to slot n % STAGES once
    # both consumers released the slot's previous slice, so the next block's first slices load
    # while the consumers finish the current one.
    NUM_SLICES: gl.constexpr = INTER // BLOCK_I
    n = 0
    for blk in range(gl.program_id(0), num_blocks, gl.num_programs(0)):
        expert = gl.load(expert_ids_ptr + blk)
        for i in range(NUM_SLICES):
            s = n % STAGES
            use = n // STAGES
            mbarrier.wait(w13_empty.index(s), (use + 1) & 1, pred=use > 0)
            _load_w13(w13_desc, w13_full, w13_bufs, expert, i, s, True, INTER, BLOCK_I)
            mbarrier.wait(wd_empty.index(s), (use + 1) & 1, pred=use > 0)
            _load_wd(wd_desc, wd_full, wd_bufs, expert, i, s, True, INTER, BLOCK_I)
            n += 1


@gluon.jit
def _gather_rows(
    a_smem, x_ptr, ids_ptr, num_tokens, num_routes, stride_xt, stride_xh, D: gl.constexpr, TOPK: gl.constexpr
):
    # Rows of x for 64 route numbers (>= num_routes: padding, zero-filled) into a_smem by cp.async.
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [_CONSUMER_WARPS, 1], [1, 0])
    routes = gl.load(ids_ptr + gl.arange(0, _ROWS, layout=gl.SliceLayout(1, layout)))
    valid = routes < num_routes
    a_row = _x_row_offsets(routes, valid, num_tokens, stride_xt, stride_xh, TOPK)
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, layout))
    async_copy.async_copy_global_to_shared(a_smem, x_ptr + a_row[:, None] + offs_d[None, :], mask=valid[:, None])
    async_copy.commit_group()


@gluon.jit
def _ws_consumer(
    x_ptr,
    probs_ptr,
    out_ptr,
    sorted_ids_ptr,
    num_blocks,
    num_tokens,
    num_routes,
    stride_xt,
    stride_xh,
    a_smem,
    m_bufs,
    w13_bufs,
    wd_bufs,
    w13_full,
    wd_full,
    w13_empty,
    wd_empty,
    ROW0: gl.constexpr,
    D: gl.constexpr,
    INTER: gl.constexpr,
    TOPK: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_I: gl.constexpr,
    STAGES: gl.constexpr,
):
    """Rows ROW0:ROW0+64 of each of the program's blocks through every slice."""
    NUM_SLICES: gl.constexpr = INTER // BLOCK_I
    LAST: gl.constexpr = NUM_SLICES - 1
    dtype: gl.constexpr = a_smem.dtype
    mma1: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[_CONSUMER_WARPS, 1], instr_shape=[16, 2 * BLOCK_I, 16]
    )
    mma2: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[_CONSUMER_WARPS, 1], instr_shape=[16, D, 16]
    )
    zero1 = gl.zeros([_ROWS, 2 * BLOCK_I], gl.float32, layout=mma1)

    _grid_dependency_wait()  # the route ids come from the kernel before this one (PDL)
    pid = gl.program_id(0)
    step = gl.num_programs(0)
    if pid < num_blocks:
        _gather_rows(
            a_smem, x_ptr, sorted_ids_ptr + pid * BLOCK_M + ROW0, num_tokens, num_routes, stride_xt, stride_xh, D, TOPK
        )
    n = 0  # global slice number of this block's slice 0: ring slot and phase
    for blk in range(pid, num_blocks, step):
        # This block's rows (issued during the previous block): each thread waits for its copies and
        # fences them toward the async proxy, then the warpgroup meets, then the wgmmas read them.
        async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()
        acc = warpgroup_mma_init(gl.zeros([_ROWS, D], gl.float32, layout=mma2))
        mbarrier.wait(w13_full.index(n % STAGES), (n // STAGES) & 1)
        gu = warpgroup_mma(a_smem, w13_bufs.index(n % STAGES).permute((1, 0)), zero1, use_acc=False, is_async=True)
        gu = warpgroup_mma_wait(num_outstanding=0, deps=(gu,))
        mbarrier.arrive(w13_empty.index(n % STAGES))
        for i in range(0, NUM_SLICES - 1):
            g1 = n + i + 1
            s1 = g1 % STAGES
            mbarrier.wait(w13_full.index(s1), (g1 // STAGES) & 1)
            gu_next = warpgroup_mma(a_smem, w13_bufs.index(s1).permute((1, 0)), zero1, use_acc=False, is_async=True)
            m_smem = m_bufs.index(i % 2)
            m_smem.store(_swiglu7_slice(gu, _ROWS, BLOCK_I, dtype))
            fence_async_shared()
            sd = (n + i) % STAGES
            mbarrier.wait(wd_full.index(sd), ((n + i) // STAGES) & 1)
            acc = warpgroup_mma(m_smem, wd_bufs.index(sd), acc, is_async=True)
            gu = warpgroup_mma_wait(num_outstanding=1, deps=(gu_next,))
            # G1(i+1) is done, and so is G2(i-1) (issued before it): release their slots.
            mbarrier.arrive(w13_empty.index(s1))
            mbarrier.arrive(wd_empty.index((n + i + STAGES - 1) % STAGES), pred=i >= 1)
        # Every gate/up MMA of this block is done: the next block's rows may overwrite a_smem while
        # the last slice, the down projection and the store of this one run.
        nxt = blk + step
        if nxt < num_blocks:
            _gather_rows(
                a_smem,
                x_ptr,
                sorted_ids_ptr + nxt * BLOCK_M + ROW0,
                num_tokens,
                num_routes,
                stride_xt,
                stride_xh,
                D,
                TOPK,
            )
        m_smem = m_bufs.index(LAST % 2)
        m_smem.store(_swiglu7_slice(gu, _ROWS, BLOCK_I, dtype))
        fence_async_shared()
        sl = n + LAST
        mbarrier.wait(wd_full.index(sl % STAGES), (sl // STAGES) & 1)
        acc = warpgroup_mma(m_smem, wd_bufs.index(sl % STAGES), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(wd_empty.index((sl + STAGES - 1) % STAGES))
        mbarrier.arrive(wd_empty.index(sl % STAGES))

        ids_ptr = sorted_ids_ptr + blk * BLOCK_M + ROW0
        routes = gl.load(ids_ptr + gl.arange(0, _ROWS, layout=gl.SliceLayout(1, mma2)))
        valid = routes < num_routes
        w = gl.load(probs_ptr + routes, mask=valid, other=0.0)
        _store_routes(acc, routes, valid, w, out_ptr, D, mma2)
        n += NUM_SLICES


@gluon.jit
def fused_expert_gluon_ws_kernel(
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
    CONSUMER_REGS: gl.constexpr,
    num_warps: gl.constexpr,
):
    """Persistent: program p does aligned 128-row blocks p, p + grid, ...; a loader warp, two consumers."""
    gl.static_assert(BLOCK_M == 2 * _ROWS)
    gl.static_assert(num_warps == _CONSUMER_WARPS)
    gl.static_assert(INTER % BLOCK_I == 0)
    gl.static_assert(INTER // BLOCK_I >= 3)
    gl.static_assert(STAGES >= 2)
    # The padded count comes from the alignment kernels that finished before the scatter started.
    num_blocks = gl.cdiv(gl.load(num_padded_ptr), BLOCK_M)
    dtype: gl.constexpr = w13_desc.dtype
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([_ROWS, D], dtype)
    m_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([_ROWS, BLOCK_I], dtype)
    a0 = gl.allocate_shared_memory(dtype, [_ROWS, D], a_layout)
    a1 = gl.allocate_shared_memory(dtype, [_ROWS, D], a_layout)
    m0 = gl.allocate_shared_memory(dtype, [2, _ROWS, BLOCK_I], m_layout)
    m1 = gl.allocate_shared_memory(dtype, [2, _ROWS, BLOCK_I], m_layout)
    w13_bufs = gl.allocate_shared_memory(dtype, [STAGES, 2 * BLOCK_I, D], w13_desc.layout)
    wd_bufs = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_I, D], wd_desc.layout)
    w13_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    wd_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    w13_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    wd_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(w13_full.index(s), count=1)
        mbarrier.init(wd_full.index(s), count=1)
        mbarrier.init(w13_empty.index(s), count=2)
        mbarrier.init(wd_empty.index(s), count=2)
    gl.warp_specialize(
        [
            (
                _ws_consumer,
                (
                    x_ptr,
                    probs_ptr,
                    out_ptr,
                    sorted_ids_ptr,
                    num_blocks,
                    num_tokens,
                    num_routes,
                    stride_xt,
                    stride_xh,
                    a0,
                    m0,
                    w13_bufs,
                    wd_bufs,
                    w13_full,
                    wd_full,
                    w13_empty,
                    wd_empty,
                    0,
                    D,
                    INTER,
                    TOPK,
                    BLOCK_M,
                    BLOCK_I,
                    STAGES,
                ),
            ),
            (
                _ws_consumer,
                (
                    x_ptr,
                    probs_ptr,
                    out_ptr,
                    sorted_ids_ptr,
                    num_blocks,
                    num_tokens,
                    num_routes,
                    stride_xt,
                    stride_xh,
                    a1,
                    m1,
                    w13_bufs,
                    wd_bufs,
                    w13_full,
                    wd_full,
                    w13_empty,
                    wd_empty,
                    _ROWS,
                    D,
                    INTER,
                    TOPK,
                    BLOCK_M,
                    BLOCK_I,
                    STAGES,
                ),
            ),
            (
                _ws_loader,
                (
                    w13_desc,
                    wd_desc,
                    w13_bufs,
                    wd_bufs,
                    w13_full,
                    wd_full,
                    w13_empty,
                    wd_empty,
                    expert_ids_ptr,
                    num_blocks,
                    INTER,
                    BLOCK_I,
                    STAGES,
                ),
            ),
        ],
        [_CONSUMER_WARPS, 1],
        [CONSUMER_REGS, 40],
    )
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(w13_full.index(s))
        mbarrier.invalidate(wd_full.index(s))
        mbarrier.invalidate(w13_empty.index(s))
        mbarrier.invalidate(wd_empty.index(s))
