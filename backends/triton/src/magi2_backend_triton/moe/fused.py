"""Launcher of the fused head-routed MoE (operators.md §3.4-3.5): BF16 as upstream, FP16 and FP32 too.

Host-side work per call is shape arithmetic and cache lookups: no host sync and no allocation
whose size depends on data, so a warmed-up forward can be captured in a CUDA graph. Under capture
the call owns its route buffers and reads raw gate/up in place (see `run_fused`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch
import triton
from torch import Tensor

from magi2_core.ops.moe_experts import validate as validate_experts

from ..interpret import interpreting as _interpreting
from .align import (
    ExpertLists,
    RouteBuffers,
    align_routes_device,
    align_routes_device_stable,
    align_routes_stable,
    expert_lists_device,
    flat_route_experts,
    route_capacity,
)
from .gluon import launch_fused_gluon, launch_fused_gluon_routed, launch_fused_gluon_ws
from .kernels import fused_expert_kernel, gemm1_swiglu7_kernel, gemm2_weighted_kernel, topk_sum_kernel
from .pack import PackedW13Cache, interleaved_bank
from .tiles import MoETiles, select_tiles
from .tma import launch_fused_tma


class MoEState:
    """Reusable route buffers and a bounded cache of packed gate/up banks for raw weights.

    Prepared weights (views of a packed bank) bypass the cache. Layers called in turn share the route
    buffers: they are rewritten by every call before they are read, so they are allocated outside
    inference mode: an inference tensor cannot be written by a later call under ``no_grad`` (a normal
    tensor can be written under either).
    """

    def __init__(self, w13_capacity: int = 8) -> None:
        self._routes: RouteBuffers | None = None
        self._lists: ExpertLists | None = None
        self.w13 = PackedW13Cache(w13_capacity)
        self.route_allocations = 0

    def route_buffers(self, num_routes: int, num_experts: int, block_m: int, device: torch.device) -> RouteBuffers:
        """Buffers for this call; reallocated only when the capacity, block or device changes."""
        capacity = route_capacity(num_routes, num_experts, block_m)
        bufs = self._routes
        if (
            bufs is None
            or bufs.capacity != capacity
            or bufs.block_m != block_m
            or bufs.counts.numel() != num_experts
            or bufs.sorted_ids.device != device
        ):
            with torch.inference_mode(False):
                bufs = RouteBuffers.allocate(capacity, block_m, num_experts, device)
            self._routes = bufs
            self.route_allocations += 1
        return bufs

    def expert_lists(self, num_experts: int, stride: int, device: torch.device) -> ExpertLists:
        """Route lists for the one-program-per-expert kernel; reallocated when the shape changes."""
        lists = self._lists
        if (
            lists is None
            or lists.stride != stride
            or lists.counts.numel() != num_experts
            or lists.lists.device != device
        ):
            with torch.inference_mode(False):
                lists = ExpertLists.allocate(num_experts, stride, device)
            self._lists = lists
            self.route_allocations += 1
        return lists

    def clear(self) -> None:
        self._routes = None
        self._lists = None
        self.w13.clear()


# Shared by plain calls: bounded (8 raw layers' banks at most, freed with their weights). A model
# with more layers prepares its weights (prepare_moe_weights) and never touches this cache.
_DEFAULT_STATE = MoEState()

# Bytes of route lists ("gluon_routed") a call may allocate; past it the aligned kernel serves. The
# lists hold every expert's worst case, T*K routes (repeated top-k ids included): 38 MB at 2048
# tokens x 3 heads x 256 experts, 151 MB with 12 heads.
LIST_BUDGET = 64 * 2**20


def _list_bytes(flat_experts: int, routes_per_head: int) -> int:
    return 4 * flat_experts * routes_per_head


@functools.lru_cache(maxsize=64)
def _capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def _tiles_for(x: Tensor, num_routes: int, num_experts: int, inter: int) -> MoETiles:
    return select_tiles(
        x.device.type, _capability(x.device), num_routes / max(num_experts, 1), wide=x.dtype == torch.float32,
        shape=(x.shape[2], inter),
    )  # fmt: skip


@dataclass
class FusedRun:
    """Everything one forward produced; the intermediates are exposed for stage tests."""

    y: Tensor  # [T, Hl, d] in x's dtype
    inter: Tensor | None  # [capacity, I] by aligned slot (rows of sentinel slots unwritten)
    routed: Tensor | None  # [R, d] per route, r = (h*T + t)*K + k
    buffers: RouteBuffers | None


def triton_fused_moe(
    x: Tensor,
    probs: Tensor,
    idx: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    *,
    state: MoEState | None = None,
    deterministic: bool = False,
) -> Tensor:
    """`fused_moe_experts` with the op contract's checks (the validating entry; the provider's path
    is `fused_moe_experts`, on inputs the op has validated)."""
    call = validate_experts(x, probs, idx, w_gate, w_up, w_down, deterministic=deterministic, compiling=False)
    return fused_moe_experts(
        call.x, call.probs, call.idx, call.w_gate, call.w_up, call.w_down, state=state, deterministic=deterministic
    )


def fused_moe_experts(
    x: Tensor,
    probs: Tensor,
    idx: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    *,
    state: MoEState | None = None,
    deterministic: bool = False,
) -> Tensor:
    """y[t,h] = sum_k rd(p[h,t,k] * (rd(SwiGLU7(x[t,h] W_gate[f], x[t,h] W_up[f])) W_down[f])).

    rd rounds to x's dtype (BF16, FP16 or FP32); products accumulate in FP32. x [T, Hl, d];
    probs [Hl, T, K] fp32; idx [Hl, T, K] int per-head expert ids; weights [Hl*E, d, I] /
    [Hl*E, I, d] in x's dtype, gate/up possibly views of a packed bank. Inputs are validated by the
    caller. No host sync. ``deterministic``: every route's slot fixed by a stable alignment (`choose_alignment`).
    """
    return run_fused(x, probs, idx, w_gate, w_up, w_down, state=state, deterministic=deterministic).y


Alignment = Literal["atomic", "stable_kernels", "stable_torch"]

# Up to this many flat experts the stable alignment kernels are at least as fast as the atomic ones
# on the H200 (benchmarks/results/moe_align_h200.json, graph p50: 28.1 vs 28.8 us at 4096 tokens and
# 36.0 vs 62.9 us at 14601 tokens with 768 experts; 117 vs 47 us with 3072 experts), so they serve
# the default mode too: one route order for both modes.
STABLE_KERNELS_MAX_EXPERTS = 1024


def choose_alignment(device_type: str, interpreting: bool, num_experts: int, deterministic: bool) -> Alignment:
    """Which route alignment a call runs.

    "stable_kernels": five kernels without atomics, each expert's routes in route order; CUDA only,
    in deterministic mode and wherever they are the faster (`STABLE_KERNELS_MAX_EXPERTS`).
    "atomic": four kernels, routes in the order the atomics gave; the default mode elsewhere.
    "stable_torch": the stable result from torch ops, for deterministic mode on MUSA (whose Triton's
    sort is untested here) and under the interpreter (which sorts slowly). Deterministic mode needs
    a stable order: a route's output is the same wherever it sits, but the execution then repeats
    exactly. Only the two kernel paths end with a scatter kernel that lets a dependent launch start.
    """
    kernels = device_type == "cuda" and not interpreting
    if kernels and (deterministic or num_experts <= STABLE_KERNELS_MAX_EXPERTS):
        return "stable_kernels"
    return "stable_torch" if deterministic else "atomic"


def align(idx: Tensor, experts_per_head: int, bufs: RouteBuffers, *, deterministic: bool) -> Alignment:
    """Fill ``bufs`` for this call's routes with the alignment `choose_alignment` names; return it."""
    num_experts = bufs.counts.numel()
    alignment = choose_alignment(idx.device.type, _interpreting(), num_experts, deterministic)
    if alignment == "stable_kernels":
        align_routes_device_stable(idx, experts_per_head, bufs)
    elif alignment == "atomic":
        align_routes_device(idx, experts_per_head, bufs)
    else:
        align_routes_stable(flat_route_experts(idx, experts_per_head), num_experts, bufs)
    return alignment


def run_fused(
    x: Tensor,
    probs: Tensor,
    idx: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    *,
    state: MoEState | None = None,
    tiles: MoETiles | None = None,
    deterministic: bool = False,
) -> FusedRun:
    """The forward of `fused_moe_experts`, with an explicit tile override and its intermediates."""
    state = _DEFAULT_STATE if state is None else state
    num_tokens, heads, d = x.shape
    topk = idx.shape[2]
    num_experts = w_gate.shape[0]
    inter_dim = w_gate.shape[2]
    dtype = x.dtype
    y = torch.empty((num_tokens, heads, d), dtype=dtype, device=x.device)
    num_routes = heads * num_tokens * topk
    if num_routes == 0:
        return FusedRun(y.zero_(), None, None, None)
    tiles = tiles or _tiles_for(x, num_routes, num_experts, inter_dim)
    interp = _interpreting()
    # The interpreter multiplies raw BF16 bits in tl.dot (hence FP32 operands there), and its FP32 -> BF16
    # cast truncates (hence rounding by hand). FP32 activations: IEEE dots (the default would be TF32).
    upcast = interp or dtype == torch.float32
    rne = interp and dtype == torch.bfloat16
    x = x.contiguous() if x.stride(2) != 1 else x
    w_down = w_down.contiguous()
    probs_flat = probs.reshape(-1).to(torch.float32)

    # The one-kernel path holds a whole activation row and whole intermediate slices in a tile.
    single = tiles.single
    if single is not None and (d & (d - 1) != 0 or inter_dim % single.block_n != 0):
        single = None
    # Inside a CUDA-graph capture nothing the graph reads may be owned by a cache that could free it
    # later (a reallocated route buffer, an evicted bank): buffers come from the graph's own pool and
    # raw gate/up are read in place. Prepared weights are views the caller keeps alive.
    capturing = x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()

    # Prepared weights are views of a packed bank: read it in place. Raw weights: the cached bank
    # when these tiles want it (or the tensors are not contiguous), else the tensors as given.
    w13 = interleaved_bank(w_gate, w_up)
    contiguous = w_gate.is_contiguous() and w_up.is_contiguous()
    want_tma = single is not None and tiles.variant != "pointer"  # the TMA variants read the packed bank
    if w13 is None and not capturing and (tiles.packed_w13 or want_tma or not contiguous):
        w13 = state.w13.get(w_gate, w_up)  # [F, 2I, d]: gate row 2i, up row 2i+1
    # Raw gate/up captured in a graph have no bank (read in place, above): the pointer kernel serves
    # that call, with the same results (the variants are bit-identical by test).
    tma = want_tma and w13 is not None
    variant = tiles.variant
    if variant == "gluon_routed" and (deterministic or _list_bytes(num_experts, num_routes // heads) > LIST_BUDGET):
        # The aligned kernel, same tile and results: deterministic mode fixes every route's slot (the
        # stable alignment below), and it needs no per-expert lists.
        variant = "gluon"
    if w13 is not None:
        wg, wu = w13, w13[:, 1:, :]
        w_strides = (w13.stride(0), w13.stride(2), 2 * w13.stride(1))
    else:
        wg, wu = w_gate.contiguous(), w_up.contiguous()
        w_strides = (wg.stride(0), wg.stride(1), wg.stride(2))

    routed = torch.empty((num_routes, d), dtype=dtype, device=x.device)
    if tma and variant == "gluon_routed":
        # One program per expert over unpadded route lists: no row-block alignment at all.
        assert single is not None and w13 is not None
        tk = num_routes // heads
        lists = (
            ExpertLists.allocate(num_experts, tk, x.device)
            if capturing
            else state.expert_lists(num_experts, tk, x.device)
        )
        expert_lists_device(idx, num_experts // heads, lists)
        launch_fused_gluon_routed(x, w13, w_down, probs_flat, routed, lists, topk=topk, tile=single)
        _topk_sum(routed, y, heads, num_tokens, d, topk, rne)
        return FusedRun(y, None, routed, None)

    # The alignment's row block must be the block of the kernels that read it.
    block_m = single.block_m if single is not None else tiles.gemm1.block_m
    if capturing:
        bufs = RouteBuffers.allocate(route_capacity(num_routes, num_experts, block_m), block_m, num_experts, x.device)
    else:
        bufs = state.route_buffers(num_routes, num_experts, block_m, x.device)
    alignment = align(idx, num_experts // heads, bufs, deterministic=deterministic)
    num_blocks_m = bufs.capacity // block_m

    inter: Tensor | None = None
    if tma and variant in ("gluon", "gluon_ws"):
        assert single is not None and w13 is not None
        launch = launch_fused_gluon_ws if variant == "gluon_ws" else launch_fused_gluon
        # Dependent launch only right after an alignment's scatter kernel (gluon.py says why).
        launch(x, w13, w_down, probs_flat, routed, bufs, topk=topk, tile=single, pdl=alignment != "stable_torch")
    elif tma:
        assert single is not None and w13 is not None
        launch_fused_tma(
            x, w13, w_down, probs_flat, routed, bufs, topk=topk, tile=single, variant=variant,
            ctas_per_sm=tiles.ctas_per_sm, upcast=upcast, rne=rne,
        )  # fmt: skip
    elif single is not None:
        fused_expert_kernel[(num_blocks_m,)](
            x, wg, wu, w_down, probs_flat, routed, bufs.sorted_ids, bufs.expert_ids, bufs.num_padded,
            num_tokens, num_routes, x.stride(0), x.stride(1), *w_strides,
            D=d, INTER=inter_dim, TOPK=topk, BLOCK_M=single.block_m, BLOCK_I=single.block_n,
            INTERLEAVED=w13 is not None and tiles.interleaved_dot, UPCAST_DOT=upcast, EXPLICIT_RNE=rne,
            num_warps=single.num_warps, num_stages=single.num_stages,
        )  # fmt: skip
    else:
        inter = torch.empty((bufs.capacity, inter_dim), dtype=dtype, device=x.device)
        t1 = tiles.gemm1
        grid1 = (num_blocks_m * triton.cdiv(inter_dim, t1.block_n),)
        gemm1_swiglu7_kernel[grid1](
            x, wg, wu, inter, bufs.sorted_ids, bufs.expert_ids, bufs.num_padded,
            num_tokens, num_routes, num_blocks_m,
            x.stride(0), x.stride(1), *w_strides,
            D=d, INTER=inter_dim, TOPK=topk, BLOCK_M=t1.block_m, BLOCK_N=t1.block_n, BLOCK_K=t1.block_k,
            GROUP_M=t1.group_m, UPCAST_DOT=upcast, EXPLICIT_RNE=rne,
            num_warps=t1.num_warps, num_stages=t1.num_stages,
        )  # fmt: skip
        t2 = tiles.gemm2
        grid2 = (num_blocks_m * triton.cdiv(d, t2.block_n),)
        gemm2_weighted_kernel[grid2](
            inter, w_down, probs_flat, routed, bufs.sorted_ids, bufs.expert_ids, bufs.num_padded,
            num_routes, num_blocks_m,
            D=d, INTER=inter_dim, BLOCK_M=t2.block_m, BLOCK_N=t2.block_n, BLOCK_K=t2.block_k,
            GROUP_M=t2.group_m, UPCAST_DOT=upcast, EXPLICIT_RNE=rne,
            num_warps=t2.num_warps, num_stages=t2.num_stages,
        )  # fmt: skip

    _topk_sum(routed, y, heads, num_tokens, d, topk, rne)
    return FusedRun(y, inter, routed, bufs)


def _topk_sum(routed: Tensor, y: Tensor, heads: int, num_tokens: int, d: int, topk: int, rne: bool) -> None:
    """y[t, h] = the K route rows of (h, t) summed in FP32 in k order, one rounding."""
    rows = heads * num_tokens
    block_r = 16 if _interpreting() else 8
    topk_sum_kernel[(triton.cdiv(rows, block_r),)](
        routed, y, rows, num_tokens, y.stride(0), y.stride(1),
        D=d, TOPK=topk, BLOCK_R=block_r, BLOCK_D=triton.next_power_of_2(d), EXPLICIT_RNE=rne,
    )  # fmt: skip
