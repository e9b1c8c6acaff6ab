"""Route alignment on the device: group routes by flat expert, pad each group to the row block.

Everything stays on the device: the padded row count is a 1-element int32 tensor the GEMMs read,
so the forward never waits for the host. Buffers are upper-bound sized and reused across calls.

The contract, for flat expert ids ``rid`` [R] with ``n_e`` routes of expert e padded to ``P_e`` (a
multiple of the row block BM) starting at ``start_e``: ``sorted_ids[start_e + j]`` is the j-th route of
expert e, rows [start_e + n_e, start_e + P_e) hold the sentinel R, and
``expert_ids[b] = #{e : cumsum(P)_e <= b*BM}``. (The tests state it in torch, ``moe_align_oracle.py``.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..interpret import interpreting


def route_capacity(num_routes: int, num_experts: int, block_m: int) -> int:
    """Upper bound on padded rows: every expert may waste up to block_m - 1 rows."""
    rows = num_routes + num_experts * (block_m - 1)
    return -(-rows // block_m) * block_m


@dataclass
class RouteBuffers:
    """Reusable alignment outputs; `capacity` rows of sorted ids, one expert id per row block."""

    sorted_ids: Tensor  # [capacity] int32; route number or the sentinel R
    expert_ids: Tensor  # [capacity // block_m] int32; flat expert owning each row block
    num_padded: Tensor  # [1] int32; rows actually used (sum of padded expert counts)
    capacity: int
    block_m: int
    counts: Tensor  # [F] int32 scratch: routes per expert
    cursor: Tensor  # [F] int32 scratch: next free slot per expert (the atomic path), first slot (stable)
    chunk: int  # routes per program of the stable path (`sort_chunk`)
    chunk_before: Tensor  # [cdiv(capacity, chunk) * F] int32, stable path: expert's routes in earlier chunks
    chunk_start: Tensor  # [cdiv(capacity, chunk) * F] int32, stable path: expert's first row in its sorted chunk

    @staticmethod
    def allocate(
        capacity: int, block_m: int, num_experts: int, device: torch.device, chunk: int | None = None
    ) -> RouteBuffers:
        """``chunk``: routes per program of the stable path, a power of two (default `sort_chunk`;
        tests pass small ones so that the interpreter sorts quickly)."""
        chunk = chunk or sort_chunk(capacity)
        if chunk & (chunk - 1):
            raise ValueError(f"chunk must be a power of two; got {chunk}")
        per_chunk = -(-capacity // chunk) * num_experts
        return RouteBuffers(
            sorted_ids=torch.empty(capacity, dtype=torch.int32, device=device),
            expert_ids=torch.empty(capacity // block_m, dtype=torch.int32, device=device),
            num_padded=torch.empty(1, dtype=torch.int32, device=device),
            capacity=capacity,
            block_m=block_m,
            counts=torch.empty(num_experts, dtype=torch.int32, device=device),
            cursor=torch.empty(num_experts, dtype=torch.int32, device=device),
            chunk=chunk,
            chunk_before=torch.empty(per_chunk, dtype=torch.int32, device=device),
            chunk_start=torch.empty(per_chunk, dtype=torch.int32, device=device),
        )


def sort_chunk(capacity: int) -> int:
    """Routes per program of `align_routes_device_stable`: a power of two, at least 1024 and at least
    capacity / 512, so at most 512 programs sort their chunks (one scan tile covers them) and the
    per-chunk counts stay small (cdiv(capacity, chunk) x F int32)."""
    covering: int = triton.next_power_of_2(-(-capacity // 512))
    return max(1024, covering)


def flat_route_experts(idx: Tensor, num_local_experts: int) -> Tensor:
    """rid[r] = h*E + idx[h,t,k] for r = (h*T + t)*K + k, as int32 (head-major flat experts)."""
    heads = idx.shape[0]
    offsets = torch.arange(heads, device=idx.device, dtype=torch.int32).mul_(num_local_experts)
    return (idx.to(torch.int32) + offsets.view(heads, 1, 1)).reshape(-1)


def align_routes_stable(rid: Tensor, num_experts: int, buffers: RouteBuffers) -> RouteBuffers:
    """The alignment without atomics, for deterministic mode: routes of one expert in route order.

    A stable sort fixes every route's slot, and the counts come from the sorted order, so two runs
    fill the buffers identically; the contract of the module's docstring, no host synchronisation.
    """
    bm = buffers.block_m
    num_routes = rid.numel()
    device = rid.device
    sorted_experts, order = torch.sort(rid, stable=True)
    edges = torch.arange(num_experts + 1, device=device, dtype=rid.dtype)
    starts = torch.searchsorted(sorted_experts, edges, out_int32=True)  # first sorted position per expert
    counts = starts[1:] - starts[:-1]
    padded = torch.div(counts + (bm - 1), bm, rounding_mode="floor").mul_(bm)
    padded_end = torch.cumsum(padded, 0, dtype=torch.int32)
    shift = (padded_end - padded) - starts[:-1]
    dest = shift[sorted_experts.long()].long() + torch.arange(num_routes, device=device)
    buffers.sorted_ids.fill_(num_routes)
    buffers.sorted_ids[dest] = order.to(torch.int32)  # distinct destinations: no accumulation
    block_starts = torch.arange(0, buffers.capacity, bm, device=device, dtype=torch.int32)
    torch.searchsorted(padded_end, block_starts, right=True, out_int32=True, out=buffers.expert_ids)
    buffers.num_padded.copy_(padded_end[-1:])
    return buffers


@triton.jit
def _flat_expert(idx_ptr, r, mask, TK, E):
    # idx is [Hl, T, K] contiguous, so route r = (h*T + t)*K + k is its flat index and h = r // (T*K).
    return (r // TK) * E + tl.load(idx_ptr + r, mask=mask, other=0).to(tl.int32)


@triton.jit
def _launch_dependents():
    # PTX griddepcontrol: a kernel launched after this one with programmatic dependent launch may
    # start before this one ends (it waits with griddepcontrol.wait where it reads our outputs).
    tl.inline_asm_elementwise(
        "griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


def _pdl(device: torch.device) -> bool:
    """Programmatic dependent launch is a CUDA feature (the trigger is PTX); never under the interpreter."""
    return device.type == "cuda" and not interpreting() and torch.version.cuda is not None


@triton.jit
def _count_kernel(idx_ptr, counts_ptr, R, TK, E, BLOCK: tl.constexpr):
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = r < R
    tl.atomic_add(counts_ptr + _flat_expert(idx_ptr, r, mask, TK, E), 1, mask=mask)


@triton.jit
def _offsets_kernel(counts_ptr, cursor_ptr, num_padded_ptr, F, BM: tl.constexpr, BLOCK_F: tl.constexpr):
    # One program: padded counts, their exclusive prefix sum (each expert's first slot) and total.
    e = tl.arange(0, BLOCK_F)
    n = tl.load(counts_ptr + e, mask=e < F, other=0)
    padded = (n + BM - 1) // BM * BM
    end = tl.cumsum(padded, 0)
    tl.store(cursor_ptr + e, end - padded, mask=e < F)
    tl.store(num_padded_ptr, tl.sum(padded, 0))


@triton.jit
def _blocks_kernel(
    counts_ptr, cursor_ptr, sorted_ids_ptr, expert_ids_ptr, R, BM: tl.constexpr, MAX_BLOCKS: tl.constexpr
):
    # One program per expert: tag its row blocks and put the sentinel R in its padding slots.
    e = tl.program_id(0)
    n = tl.load(counts_ptr + e)
    start = tl.load(cursor_ptr + e)
    offs = tl.arange(0, BM)
    pad = (n + BM - 1) // BM * BM - n  # a block mask, not block & scalar: Triton 3.9's interpreter rejects that
    tl.store(sorted_ids_ptr + start + n + offs, R, mask=offs < pad)
    b = tl.arange(0, MAX_BLOCKS)
    tl.store(expert_ids_ptr + start // BM + b, e, mask=b < (n + BM - 1) // BM)


@triton.jit
def _scatter_kernel(idx_ptr, cursor_ptr, sorted_ids_ptr, R, TK, E, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # Slot order inside an expert follows the atomics (not stable); the contract only fixes the
    # per-expert route sets, and every route's output is independent of its row in the block.
    if PDL:  # the Gluon expert kernel, launched with programmatic dependent launch, may start now
        _launch_dependents()
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = r < R
    slot = tl.atomic_add(cursor_ptr + _flat_expert(idx_ptr, r, mask, TK, E), 1, mask=mask)
    tl.store(sorted_ids_ptr + slot, r, mask=mask)


def align_routes_device(idx: Tensor, num_local_experts: int, buffers: RouteBuffers) -> RouteBuffers:
    """The alignment as four small kernels reading `idx` [Hl, T, K] directly (no flat-id tensor).

    The contract (the module's docstring) on rows [0, num_padded); slots past num_padded and their
    block ids are left as they were (the GEMMs exit there). No host synchronisation.
    """
    bm = buffers.block_m
    num_routes = idx.numel()
    num_experts = buffers.counts.numel()
    idx = idx.contiguous()
    tk = idx.shape[1] * idx.shape[2]
    block = 1024
    grid = (triton.cdiv(num_routes, block),)
    buffers.counts.zero_()
    if num_routes > 0:
        _count_kernel[grid](idx, buffers.counts, num_routes, tk, num_local_experts, BLOCK=block)
    block_f = triton.next_power_of_2(num_experts)
    _offsets_kernel[(1,)](buffers.counts, buffers.cursor, buffers.num_padded, num_experts, BM=bm, BLOCK_F=block_f)
    max_blocks = triton.next_power_of_2(max(triton.cdiv(num_routes, bm), 1))
    _blocks_kernel[(num_experts,)](
        buffers.counts, buffers.cursor, buffers.sorted_ids, buffers.expert_ids, num_routes, BM=bm, MAX_BLOCKS=max_blocks
    )
    if num_routes > 0:
        _scatter_kernel[grid](
            idx,
            buffers.cursor,
            buffers.sorted_ids,
            num_routes,
            tk,
            num_local_experts,
            BLOCK=block,
            PDL=_pdl(idx.device),
        )
    return buffers


@triton.jit
def _chunk_counts_kernel(idx_ptr, before_ptr, start_ptr, R, TK, E, F, CHUNK: tl.constexpr, BINS: tl.constexpr):
    # Program p, routes [p*CHUNK, (p+1)*CHUNK): each flat expert's count (into before_ptr, scanned
    # down the chunks next) and where its run starts once the chunk is sorted by expert (start_ptr).
    # Routes past R go to bin F, which is not stored (BINS > F).
    p = tl.program_id(0)
    r = p * CHUNK + tl.arange(0, CHUNK)
    mask = r < R
    f = tl.where(mask, _flat_expert(idx_ptr, r, mask, TK, E), F)
    counts = tl.histogram(f, BINS)
    b = tl.arange(0, BINS)
    tl.store(before_ptr + p * F + b, counts, mask=b < F)
    tl.store(start_ptr + p * F + b, tl.cumsum(counts, 0) - counts, mask=b < F)


@triton.jit
def _chunk_scan_kernel(before_ptr, counts_ptr, P, F, BLOCK_P: tl.constexpr, BLOCK_F: tl.constexpr):
    # Experts [q*BLOCK_F, ...), all P <= BLOCK_P chunks at once: each chunk's count becomes the number
    # of the expert's routes in the chunks before it (an exclusive scan down the chunks, in place),
    # and the totals go to counts. (One tile, no loop: P is at most 512 with the default `sort_chunk`.)
    f = tl.program_id(0) * BLOCK_F + tl.arange(0, BLOCK_F)
    p = tl.arange(0, BLOCK_P)
    ptrs = before_ptr + p[:, None] * F + f[None, :]
    ok = (p[:, None] < P) & (f[None, :] < F)
    n = tl.load(ptrs, mask=ok, other=0)
    tl.store(ptrs, tl.cumsum(n, 0) - n, mask=ok)
    tl.store(counts_ptr + f, tl.sum(n, 0), mask=f < F)


@triton.jit
def _stable_scatter_kernel(
    idx_ptr,
    before_ptr,
    start_ptr,
    cursor_ptr,
    sorted_ids_ptr,
    R,
    TK,
    E,
    F,
    CHUNK: tl.constexpr,
    PDL: tl.constexpr,
):
    # Program p sorts its chunk by (expert, route). A route at sorted position j of expert e lands in
    # slot cursor[e] (the expert's first slot) + before[p, e] (its routes in earlier chunks)
    # + j - start[p, e] (its rank in this chunk): slots follow route order, so the result is stable.
    if PDL:  # the Gluon expert kernel, launched with programmatic dependent launch, may start now
        _launch_dependents()
    p = tl.program_id(0)
    pos = tl.arange(0, CHUNK)
    r = p * CHUNK + pos
    mask = r < R
    f = tl.where(mask, _flat_expert(idx_ptr, r, mask, TK, E), F)
    key = tl.sort(f * CHUNK + pos)  # F * CHUNK + CHUNK < 2**31 (checked by the launcher)
    e = key // CHUNK
    ok = e < F
    at = p * F + e
    slot = (
        tl.load(cursor_ptr + e, mask=ok, other=0)
        + tl.load(before_ptr + at, mask=ok, other=0)
        - tl.load(start_ptr + at, mask=ok, other=0)
    )
    tl.store(sorted_ids_ptr + slot + pos, p * CHUNK + key % CHUNK, mask=ok)


def align_routes_device_stable(idx: Tensor, num_local_experts: int, buffers: RouteBuffers) -> RouteBuffers:
    """The alignment without atomics, as five kernels: `align_routes_stable`'s result bit for bit
    (each expert's routes in route order), so deterministic mode can use it; no host sync.

    Routes are cut in chunks of `buffers.chunk`: per-chunk expert counts (a histogram per program),
    an exclusive scan of them down the chunks, the padded offsets and row-block tags (the kernels of
    `align_routes_device`), then a scatter where each program sorts its chunk by (expert, route).
    """
    bm = buffers.block_m
    num_routes = idx.numel()
    num_experts = buffers.counts.numel()
    if num_experts * buffers.chunk + buffers.chunk >= 2**31:
        raise ValueError(f"{num_experts} experts x chunks of {buffers.chunk} routes overflow the int32 sort key")
    idx = idx.contiguous()
    tk = idx.shape[1] * idx.shape[2]
    chunk = buffers.chunk
    num_chunks = triton.cdiv(num_routes, chunk)
    warps = max(4, min(16, chunk // 256))  # 8 to 16 routes per thread
    if num_routes > 0:
        _chunk_counts_kernel[(num_chunks,)](
            idx,
            buffers.chunk_before,
            buffers.chunk_start,
            num_routes,
            tk,
            num_local_experts,
            num_experts,
            CHUNK=chunk,
            BINS=triton.next_power_of_2(num_experts + 1),
            num_warps=warps,
        )
        block_p = triton.next_power_of_2(num_chunks)
        block_f = max(16, 8192 // block_p)
        _chunk_scan_kernel[(triton.cdiv(num_experts, block_f),)](
            buffers.chunk_before, buffers.counts, num_chunks, num_experts, BLOCK_P=block_p, BLOCK_F=block_f
        )
    else:
        buffers.counts.zero_()
    block_f = triton.next_power_of_2(num_experts)
    _offsets_kernel[(1,)](buffers.counts, buffers.cursor, buffers.num_padded, num_experts, BM=bm, BLOCK_F=block_f)
    max_blocks = triton.next_power_of_2(max(triton.cdiv(num_routes, bm), 1))
    _blocks_kernel[(num_experts,)](
        buffers.counts, buffers.cursor, buffers.sorted_ids, buffers.expert_ids, num_routes, BM=bm, MAX_BLOCKS=max_blocks
    )
    if num_routes > 0:
        _stable_scatter_kernel[(num_chunks,)](
            idx,
            buffers.chunk_before,
            buffers.chunk_start,
            buffers.cursor,
            buffers.sorted_ids,
            num_routes,
            tk,
            num_local_experts,
            num_experts,
            CHUNK=chunk,
            PDL=_pdl(idx.device),
            num_warps=warps,
        )
    return buffers


@dataclass
class ExpertLists:
    """Each flat expert's routes, unpadded: ``lists[f * stride + j]`` for j < ``counts[f]``.

    The input of the one-program-per-expert kernel (`kernels_gluon.fused_expert_gluon_routed_kernel`),
    built by one scatter kernel where the row-block alignment takes four. ``stride`` is T*K, the
    routes of one head, which bounds any one expert's count (even with repeated ids in a token's
    top-k), so the lists hold F*T*K int32: the tile table picks this path only where T*K/E is small,
    and `fused.LIST_BUDGET` caps the bytes (past it the aligned kernel serves).
    """

    lists: Tensor  # [F * stride] int32
    counts: Tensor  # [F] int32
    stride: int

    @staticmethod
    def allocate(num_experts: int, stride: int, device: torch.device) -> ExpertLists:
        return ExpertLists(
            lists=torch.empty(num_experts * stride, dtype=torch.int32, device=device),
            counts=torch.empty(num_experts, dtype=torch.int32, device=device),
            stride=stride,
        )


@triton.jit
def _lists_kernel(idx_ptr, counts_ptr, lists_ptr, R, TK, E, BLOCK: tl.constexpr, PDL: tl.constexpr):
    # Order inside a list follows the atomics (not stable), as in `_scatter_kernel`.
    if PDL:  # let the expert kernel (launched with programmatic dependent launch) start its copies
        _launch_dependents()
    r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = r < R
    f = _flat_expert(idx_ptr, r, mask, TK, E)
    slot = tl.atomic_add(counts_ptr + f, 1, mask=mask)
    tl.store(lists_ptr + f.to(tl.int64) * TK + slot, r, mask=mask)


def expert_lists_device(idx: Tensor, num_local_experts: int, lists: ExpertLists) -> ExpertLists:
    """Fill ``lists`` from ``idx`` [Hl, T, K]: a memset and one kernel, no host synchronisation."""
    num_routes = idx.numel()
    idx = idx.contiguous()
    tk = idx.shape[1] * idx.shape[2]
    if lists.stride != tk:
        raise ValueError(f"expert lists sized for {lists.stride} routes per head; this call has {tk}")
    lists.counts.zero_()
    if num_routes > 0:
        block = 1024
        _lists_kernel[(triton.cdiv(num_routes, block),)](
            idx,
            lists.counts,
            lists.lists,
            num_routes,
            tk,
            num_local_experts,
            BLOCK=block,
            PDL=_pdl(idx.device),
        )
    return lists
