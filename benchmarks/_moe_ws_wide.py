"""A prototype, outside the wheel: the warp-specialised Gluon MoE with 64-wide intermediate slices.

docs/moe-notes.md ("What bounds T = 14601 now") has the arithmetic. The shipped ``gluon_ws`` kernel
feeds each consumer warpgroup's gate/up MMA 32 intermediate columns at a time (wgmma N = 64), so each
k-step reads as many shared-memory bytes for A as for B, and shared memory, not the tensor cores,
bounds the kernel. Here a slice is 64 wide (N = 128), and the weights stream through rings of 16 KB
chunks so that the shared memory still fits:

* gate/up: per slice, ``D / 64`` chunks of ``[64 gate + 64 up rows, 64 of d]`` (two TMA boxes each);
* down: per slice, ``BLOCK_I / 32`` chunks of ``[32 of I, d]``.

A consumer holds one ``[64, 128]`` gate/up accumulator besides its ``[64, d]`` down accumulator, so
G1 of the next slice cannot run under SwiGLU7 of this one inside a consumer. The two consumers take
turns instead: each issues one burst (G2 of the previous slice, then G1 of this one), hands the turn to
the other through an mbarrier, and runs SwiGLU7 while the other's burst holds the tensor cores. Every
chunk's slot is released as soon as the MMA group that read it is done.

Same math and rounding schedule as ``gluon_ws`` (FP32 accumulation in K order, SwiGLU7 in FP32, one
rounding per slice and per route), so its outputs are expected to equal the shipped kernel's bit for
bit; ``benchmarks/moe_ws_wide.py`` checks that and times both. GPU only (Hopper, Triton with Gluon).
"""

from __future__ import annotations

import torch
from magi2_backend_triton.moe.gluon import _sm_count, dependent_launch
from magi2_backend_triton.moe.kernels_gluon import _grid_dependency_wait, _store_routes, _swiglu7_slice
from magi2_backend_triton.moe.kernels_gluon_ws import _gather_rows
from magi2_backend_triton.moe.operands import Operands, bank, kernel_operands, row_blocks
from magi2_backend_triton.moe.tiles import Launch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_init,
    warpgroup_mma_wait,
)

BLOCK_I = 64  # intermediate columns per slice
KC = 64  # d per gate/up chunk
DC = 32  # intermediate rows per down chunk
W13_SLOTS = 7  # gate/up chunks in flight (16 KB each)
WD_SLOTS = 2  # down chunks in flight (16 KB each at d = 256)
CONSUMER_REGS = 232

_ROWS = gl.constexpr(64)
_CONSUMER_WARPS = gl.constexpr(4)


@gluon.jit
def _loader(
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
    D: gl.constexpr,
    INTER: gl.constexpr,
    BLOCK_I: gl.constexpr,
    KC: gl.constexpr,
    DC: gl.constexpr,
    S1: gl.constexpr,
    S2: gl.constexpr,
):
    # In the order the consumers read them: a burst runs G2 of slice g-1, then G1 of slice g, so slice
    # g-1's down chunks come before slice g's gate/up chunks. A chunk waits for its slot's previous
    # chunk to be released by both consumers.
    NUM_SLICES: gl.constexpr = INTER // BLOCK_I
    NK: gl.constexpr = D // KC
    ND: gl.constexpr = BLOCK_I // DC
    n1 = 0
    n2 = 0
    prev_row = 0
    g = 0
    for blk in range(gl.program_id(0), num_blocks, gl.num_programs(0)):
        expert = gl.load(expert_ids_ptr + blk)
        for i in range(NUM_SLICES):
            row = expert * INTER + i * BLOCK_I
            if g > 0:
                n2 = _load_down(wd_desc, wd_bufs, wd_full, wd_empty, prev_row, n2, DC, ND, S2)
            for k in gl.static_range(NK):
                s = (n1 + k) % S1
                use = (n1 + k) // S1
                mbarrier.wait(w13_empty.index(s), (use + 1) & 1, pred=use > 0)
                buf = w13_bufs.index(s)
                mbarrier.expect(w13_full.index(s), 2 * w13_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(w13_desc, [row, k * KC], w13_full.index(s), buf.slice(0, BLOCK_I))
                tma.async_copy_global_to_shared(
                    w13_desc, [row, D + k * KC], w13_full.index(s), buf.slice(BLOCK_I, BLOCK_I)
                )
            n1 += NK
            prev_row = row
            g += 1
    if g > 0:
        n2 = _load_down(wd_desc, wd_bufs, wd_full, wd_empty, prev_row, n2, DC, ND, S2)


@gluon.jit
def _load_down(wd_desc, wd_bufs, wd_full, wd_empty, row, n2, DC: gl.constexpr, ND: gl.constexpr, S2: gl.constexpr):
    for j in gl.static_range(ND):
        s = (n2 + j) % S2
        use = (n2 + j) // S2
        mbarrier.wait(wd_empty.index(s), (use + 1) & 1, pred=use > 0)
        mbarrier.expect(wd_full.index(s), wd_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(wd_desc, [row + j * DC, 0], wd_full.index(s), wd_bufs.index(s))
    return n2 + ND


@gluon.jit
def _burst(
    acc,
    a_smem,
    m_smem,
    w13_bufs,
    wd_bufs,
    w13_full,
    wd_full,
    w13_empty,
    wd_empty,
    my_turn,
    their_turn,
    n1,
    n2,
    b,
    FIRST: gl.constexpr,
    HAS_G2: gl.constexpr,
    HAS_G1: gl.constexpr,
    D: gl.constexpr,
    BLOCK_I: gl.constexpr,
    KC: gl.constexpr,
    DC: gl.constexpr,
    S1: gl.constexpr,
    S2: gl.constexpr,
):
    """One turn on the tensor cores: G2 of the previous slice (HAS_G2), then G1 of this one (HAS_G1),
    waited for group by group, each chunk's slot released as its group completes. Returns the down
    accumulator (in flight), the gate/up result (complete when HAS_G1) and the counters."""
    NK: gl.constexpr = D // KC
    ND: gl.constexpr = BLOCK_I // DC
    mma1: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[_CONSUMER_WARPS, 1], instr_shape=[16, 2 * BLOCK_I, 16]
    )
    gu = gl.zeros([_ROWS, 2 * BLOCK_I], gl.float32, layout=mma1)
    # Consumer 0 (FIRST = 1) starts; after that each waits for the other's previous burst to be issued.
    w = b - FIRST
    mbarrier.wait(my_turn, w & 1, pred=w >= 0)
    if HAS_G2:
        for j in gl.static_range(ND):
            s2 = (n2 + j) % S2
            mbarrier.wait(wd_full.index(s2), ((n2 + j) // S2) & 1)
            acc = warpgroup_mma(m_smem.index(j), wd_bufs.index(s2), acc, is_async=True)
    if HAS_G1:
        for k in gl.static_range(NK):
            s1 = (n1 + k) % S1
            mbarrier.wait(w13_full.index(s1), ((n1 + k) // S1) & 1)
            gu = warpgroup_mma(
                a_smem.slice(k * KC, KC, dim=1), w13_bufs.index(s1).permute((1, 0)), gu, use_acc=k > 0, is_async=True
            )
    mbarrier.arrive(their_turn)
    if HAS_G2:
        for j in gl.static_range(ND):
            if HAS_G1:
                gu = warpgroup_mma_wait(num_outstanding=ND - 1 - j + NK, deps=(gu,))
            else:
                acc = warpgroup_mma_wait(num_outstanding=ND - 1 - j, deps=(acc,))
            mbarrier.arrive(wd_empty.index((n2 + j) % S2))
        n2 += ND
    if HAS_G1:
        for k in gl.static_range(NK):
            gu = warpgroup_mma_wait(num_outstanding=NK - 1 - k, deps=(gu,))
            mbarrier.arrive(w13_empty.index((n1 + k) % S1))
        n1 += NK
    return acc, gu, n1, n2, b + 1


@gluon.jit
def _consumer(
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
    m_smem,
    w13_bufs,
    wd_bufs,
    w13_full,
    wd_full,
    w13_empty,
    wd_empty,
    my_turn,
    their_turn,
    FIRST: gl.constexpr,
    ROW0: gl.constexpr,
    D: gl.constexpr,
    INTER: gl.constexpr,
    TOPK: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_I: gl.constexpr,
    KC: gl.constexpr,
    DC: gl.constexpr,
    S1: gl.constexpr,
    S2: gl.constexpr,
):
    NUM_SLICES: gl.constexpr = INTER // BLOCK_I
    ND: gl.constexpr = BLOCK_I // DC
    dtype: gl.constexpr = a_smem.dtype
    mma2: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[_CONSUMER_WARPS, 1], instr_shape=[16, D, 16]
    )
    _grid_dependency_wait()  # the route ids come from the kernel before this one (PDL)
    pid = gl.program_id(0)
    step = gl.num_programs(0)
    if pid < num_blocks:
        _gather_rows(
            a_smem, x_ptr, sorted_ids_ptr + pid * BLOCK_M + ROW0, num_tokens, num_routes, stride_xt, stride_xh, D, TOPK
        )
    n1 = 0
    n2 = 0
    b = 0
    for blk in range(pid, num_blocks, step):
        async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()
        acc = warpgroup_mma_init(gl.zeros([_ROWS, D], gl.float32, layout=mma2))
        acc, gu, n1, n2, b = _burst(
            acc,
            a_smem,
            m_smem,
            w13_bufs,
            wd_bufs,
            w13_full,
            wd_full,
            w13_empty,
            wd_empty,
            my_turn,
            their_turn,
            n1,
            n2,
            b,
            FIRST,
            False,
            True,
            D,
            BLOCK_I,
            KC,
            DC,
            S1,
            S2,
        )
        for _i in range(1, NUM_SLICES):
            _swiglu_to_shared(gu, m_smem, BLOCK_I, DC, ND, dtype)
            acc, gu, n1, n2, b = _burst(
                acc,
                a_smem,
                m_smem,
                w13_bufs,
                wd_bufs,
                w13_full,
                wd_full,
                w13_empty,
                wd_empty,
                my_turn,
                their_turn,
                n1,
                n2,
                b,
                FIRST,
                True,
                True,
                D,
                BLOCK_I,
                KC,
                DC,
                S1,
                S2,
            )
        _swiglu_to_shared(gu, m_smem, BLOCK_I, DC, ND, dtype)
        acc, gu, n1, n2, b = _burst(
            acc,
            a_smem,
            m_smem,
            w13_bufs,
            wd_bufs,
            w13_full,
            wd_full,
            w13_empty,
            wd_empty,
            my_turn,
            their_turn,
            n1,
            n2,
            b,
            FIRST,
            True,
            False,
            D,
            BLOCK_I,
            KC,
            DC,
            S1,
            S2,
        )
        # Every MMA of this block is done: the next block's rows may overwrite a_smem.
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
        ids_ptr = sorted_ids_ptr + blk * BLOCK_M + ROW0
        routes = gl.load(ids_ptr + gl.arange(0, _ROWS, layout=gl.SliceLayout(1, mma2)))
        valid = routes < num_routes
        w = gl.load(probs_ptr + routes, mask=valid, other=0.0)
        _store_routes(acc, routes, valid, w, out_ptr, D, mma2)


@gluon.jit
def _swiglu_to_shared(gu, m_smem, BLOCK_I: gl.constexpr, DC: gl.constexpr, ND: gl.constexpr, dtype: gl.constexpr):
    # SwiGLU7 of the slice, one rounding, stored as ND chunks of DC columns (the A operands of G2).
    h = _swiglu7_slice(gu, _ROWS, BLOCK_I, dtype)
    gl.static_assert(ND == 2)
    h0, h1 = gl.split(gl.permute(gl.reshape(h, [_ROWS, 2, DC]), (0, 2, 1)))
    m_smem.index(0).store(h0)
    m_smem.index(1).store(h1)
    fence_async_shared()


@gluon.jit
def fused_expert_gluon_ws_wide_kernel(
    x_ptr,
    w13_desc,  # packed bank as [F*I, 2d], block [BLOCK_I, KC]
    wd_desc,  # w_down as [F*I, d], block [DC, d]
    probs_ptr,
    out_ptr,
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
    KC: gl.constexpr,
    DC: gl.constexpr,
    S1: gl.constexpr,
    S2: gl.constexpr,
    CONSUMER_REGS: gl.constexpr,
    num_warps: gl.constexpr,
):
    gl.static_assert(BLOCK_M == 2 * _ROWS)
    gl.static_assert(num_warps == _CONSUMER_WARPS)
    gl.static_assert(INTER % BLOCK_I == 0)
    gl.static_assert(INTER // BLOCK_I >= 2)
    gl.static_assert(D % KC == 0)
    gl.static_assert(BLOCK_I == 2 * DC)
    num_blocks = gl.cdiv(gl.load(num_padded_ptr), BLOCK_M)
    dtype: gl.constexpr = w13_desc.dtype
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([_ROWS, D], dtype)
    m_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([_ROWS, DC], dtype)
    a0 = gl.allocate_shared_memory(dtype, [_ROWS, D], a_layout)
    a1 = gl.allocate_shared_memory(dtype, [_ROWS, D], a_layout)
    m0 = gl.allocate_shared_memory(dtype, [2, _ROWS, DC], m_layout)
    m1 = gl.allocate_shared_memory(dtype, [2, _ROWS, DC], m_layout)
    w13_bufs = gl.allocate_shared_memory(dtype, [S1, 2 * BLOCK_I, KC], w13_desc.layout)
    wd_bufs = gl.allocate_shared_memory(dtype, [S2, DC, D], wd_desc.layout)
    w13_full = gl.allocate_shared_memory(gl.int64, [S1, 1], mbarrier.MBarrierLayout())
    w13_empty = gl.allocate_shared_memory(gl.int64, [S1, 1], mbarrier.MBarrierLayout())
    wd_full = gl.allocate_shared_memory(gl.int64, [S2, 1], mbarrier.MBarrierLayout())
    wd_empty = gl.allocate_shared_memory(gl.int64, [S2, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(S1):
        mbarrier.init(w13_full.index(s), count=1)
        mbarrier.init(w13_empty.index(s), count=2)
    for s in gl.static_range(S2):
        mbarrier.init(wd_full.index(s), count=1)
        mbarrier.init(wd_empty.index(s), count=2)
    mbarrier.init(turns.index(0), count=1)
    mbarrier.init(turns.index(1), count=1)
    gl.warp_specialize(
        [
            (
                _consumer,
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
                    turns.index(0),
                    turns.index(1),
                    1,
                    0,
                    D,
                    INTER,
                    TOPK,
                    BLOCK_M,
                    BLOCK_I,
                    KC,
                    DC,
                    S1,
                    S2,
                ),
            ),
            (
                _consumer,
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
                    turns.index(1),
                    turns.index(0),
                    0,
                    _ROWS,
                    D,
                    INTER,
                    TOPK,
                    BLOCK_M,
                    BLOCK_I,
                    KC,
                    DC,
                    S1,
                    S2,
                ),
            ),
            (
                _loader,
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
                    D,
                    INTER,
                    BLOCK_I,
                    KC,
                    DC,
                    S1,
                    S2,
                ),
            ),
        ],
        [_CONSUMER_WARPS, 1],
        [CONSUMER_REGS, 40],
    )
    for s in gl.static_range(S1):
        mbarrier.invalidate(w13_full.index(s))
        mbarrier.invalidate(w13_empty.index(s))
    for s in gl.static_range(S2):
        mbarrier.invalidate(wd_full.index(s))
        mbarrier.invalidate(wd_empty.index(s))
    mbarrier.invalidate(turns.index(0))
    mbarrier.invalidate(turns.index(1))


def descriptors(x: torch.Tensor, w13: torch.Tensor, w_down: torch.Tensor) -> tuple[object, object]:
    """TMA descriptors: gate/up boxes of [BLOCK_I, KC] from the bank's [F*I, 2d] view, down boxes of [DC, d]."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    num_experts, two_inter, d = w13.shape
    inter = two_inter // 2
    elem = gl.bfloat16 if x.dtype == torch.bfloat16 else gl.float16
    w13_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_I, KC], elem)
    wd_layout = gl.NVMMASharedLayout.get_default_for([DC, d], elem)
    w13_desc = TensorDescriptor.from_tensor(w13.reshape(num_experts * inter, 2 * d), [BLOCK_I, KC], w13_layout)
    wd_desc = TensorDescriptor.from_tensor(w_down.reshape(num_experts * inter, d), [DC, d], wd_layout)
    return w13_desc, wd_desc


def launch_gluon_ws_wide(ops: Operands, launch: Launch, routes: object) -> None:
    """A drop-in for the ``gluon_ws`` launcher (same operands, same 128-row aligned routes)."""
    w13, tile = bank(ops, launch)
    assert tile.block_m == 128, "the prototype takes the gluon_ws plans' 128-row blocks"
    bufs = row_blocks(routes)  # type: ignore[arg-type]
    x = ops.x
    operands = kernel_operands(ops, descriptors(x, w13, ops.w_down), bufs)
    blocks = bufs.capacity // tile.block_m
    fused_expert_gluon_ws_wide_kernel[(min(blocks, _sm_count(x.device)),)](
        *operands,
        D=x.shape[2],
        INTER=w13.shape[1] // 2,
        TOPK=ops.topk,
        BLOCK_M=128,
        BLOCK_I=BLOCK_I,
        KC=KC,
        DC=DC,
        S1=W13_SLOTS,
        S2=WD_SLOTS,
        CONSUMER_REGS=CONSUMER_REGS,
        num_warps=4,
        launch_pdl=dependent_launch(launch),
    )
