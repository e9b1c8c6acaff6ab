"""Launcher of the fused head-routed BF16 MoE (operators.md §3.4-3.5)."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
from torch import Tensor

from .align import RouteBuffers, align_routes_device, route_capacity
from .kernels import fused_expert_kernel, gemm1_swiglu7_kernel, gemm2_weighted_kernel, topk_sum_kernel
from .pack import PackedW13Cache
from .tiles import MoETiles, select_tiles


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


class MoEState:
    """Reusable route buffers and the packed gate/up cache of one MoE layer (or of plain calls)."""

    def __init__(self) -> None:
        self._routes: RouteBuffers | None = None
        self.w13 = PackedW13Cache()
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
            bufs = RouteBuffers.allocate(capacity, block_m, num_experts, device)
            self._routes = bufs
            self.route_allocations += 1
        return bufs

    def clear(self) -> None:
        self._routes = None
        self.w13.clear()


_DEFAULT_STATE = MoEState()


@functools.lru_cache(maxsize=64)
def _capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def _tiles_for(x: Tensor, num_routes: int, num_experts: int) -> MoETiles:
    return select_tiles(x.device.type, _capability(x.device), num_routes / max(num_experts, 1))


@dataclass
class FusedRun:
    """Everything one forward produced; the intermediates are exposed for stage tests."""

    y: Tensor  # [T, Hl, d] bf16
    inter: Tensor | None  # [capacity, I] bf16 by aligned slot (rows of sentinel slots unwritten)
    routed: Tensor | None  # [R, d] bf16 per route, r = (h*T + t)*K + k
    buffers: RouteBuffers | None


def fused_moe_experts(
    x: Tensor,
    probs: Tensor,
    idx: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    *,
    state: MoEState | None = None,
) -> Tensor:
    """y[t,h] = sum_k bf16(p[h,t,k] * (bf16(SwiGLU7(x[t,h] W_gate[f], x[t,h] W_up[f])) W_down[f])).

    x [T, Hl, d] bf16; probs [Hl, T, K] fp32; idx [Hl, T, K] int per-head expert ids; weights
    [Hl*E, d, I] / [Hl*E, I, d] bf16. Inputs are validated by the caller. No host sync.
    """
    return run_fused(x, probs, idx, w_gate, w_up, w_down, state=state).y


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
) -> FusedRun:
    """The forward of `fused_moe_experts`, with an explicit tile override and its intermediates."""
    state = _DEFAULT_STATE if state is None else state
    num_tokens, heads, d = x.shape
    topk = idx.shape[2]
    num_experts = w_gate.shape[0]
    inter_dim = w_gate.shape[2]
    y = torch.empty((num_tokens, heads, d), dtype=torch.bfloat16, device=x.device)
    num_routes = heads * num_tokens * topk
    if num_routes == 0:
        return FusedRun(y.zero_(), None, None, None)
    tiles = tiles or _tiles_for(x, num_routes, num_experts)
    interp = _interpreting()
    x = x.contiguous() if x.stride(2) != 1 else x
    w_down = w_down.contiguous()
    probs_flat = probs.reshape(-1).to(torch.float32)

    # The one-kernel path holds a whole activation row and whole intermediate slices in a tile.
    single = tiles.single
    if single is not None and (d & (d - 1) != 0 or inter_dim % single.block_n != 0):
        single = None
    # The alignment's row block must be the block of the kernels that read it.
    block_m = single.block_m if single is not None else tiles.gemm1.block_m
    bufs = state.route_buffers(num_routes, num_experts, block_m, x.device)
    align_routes_device(idx, num_experts // heads, bufs)
    num_blocks_m = bufs.capacity // block_m

    if tiles.packed_w13:
        w13 = state.w13.get(w_gate, w_up)  # [F, 2I, d]: gate row 2i, up row 2i+1
        wg, wu = w13, w13[:, 1:, :]
        w_strides = (w13.stride(0), w13.stride(2), 2 * w13.stride(1))
    else:
        wg, wu = w_gate.contiguous(), w_up.contiguous()
        w_strides = (wg.stride(0), wg.stride(1), wg.stride(2))

    routed = torch.empty((num_routes, d), dtype=torch.bfloat16, device=x.device)
    inter: Tensor | None = None
    if single is not None:
        fused_expert_kernel[(num_blocks_m,)](
            x, wg, wu, w_down, probs_flat, routed, bufs.sorted_ids, bufs.expert_ids, bufs.num_padded,
            num_tokens, num_routes, x.stride(0), x.stride(1), *w_strides,
            D=d, INTER=inter_dim, TOPK=topk, BLOCK_M=single.block_m, BLOCK_I=single.block_n,
            INTERLEAVED=tiles.packed_w13 and tiles.interleaved_dot, UPCAST_DOT=interp, EXPLICIT_RNE=interp, num_warps=single.num_warps, num_stages=single.num_stages,
        )  # fmt: skip
    else:
        inter = torch.empty((bufs.capacity, inter_dim), dtype=torch.bfloat16, device=x.device)
        t1 = tiles.gemm1
        grid1 = (num_blocks_m * triton.cdiv(inter_dim, t1.block_n),)
        gemm1_swiglu7_kernel[grid1](
            x, wg, wu, inter, bufs.sorted_ids, bufs.expert_ids, bufs.num_padded,
            num_tokens, num_routes, num_blocks_m,
            x.stride(0), x.stride(1), *w_strides,
            D=d, INTER=inter_dim, TOPK=topk, BLOCK_M=t1.block_m, BLOCK_N=t1.block_n, BLOCK_K=t1.block_k,
            GROUP_M=t1.group_m, UPCAST_DOT=interp, EXPLICIT_RNE=interp,
            num_warps=t1.num_warps, num_stages=t1.num_stages,
        )  # fmt: skip
        t2 = tiles.gemm2
        grid2 = (num_blocks_m * triton.cdiv(d, t2.block_n),)
        gemm2_weighted_kernel[grid2](
            inter, w_down, probs_flat, routed, bufs.sorted_ids, bufs.expert_ids, bufs.num_padded,
            num_routes, num_blocks_m,
            D=d, INTER=inter_dim, BLOCK_M=t2.block_m, BLOCK_N=t2.block_n, BLOCK_K=t2.block_k,
            GROUP_M=t2.group_m, UPCAST_DOT=interp, EXPLICIT_RNE=interp,
            num_warps=t2.num_warps, num_stages=t2.num_stages,
        )  # fmt: skip

    rows = heads * num_tokens
    block_r = 16 if interp else 8
    topk_sum_kernel[(triton.cdiv(rows, block_r),)](
        routed, y, rows, num_tokens, y.stride(0), y.stride(1),
        D=d, TOPK=topk, BLOCK_R=block_r, BLOCK_D=triton.next_power_of_2(d), EXPLICIT_RNE=interp,
    )  # fmt: skip
    return FusedRun(y, inter, routed, bufs)
