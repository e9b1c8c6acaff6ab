"""Launcher of the fused head-routed MoE (operators.md §3.4-3.5): BF16 as upstream, FP16 and FP32 too.

Host-side work per call is shape arithmetic and cache lookups: no host sync and no allocation
whose size depends on data, so a warmed-up forward can be captured in a CUDA graph. Under capture
the call owns its route buffers. Raw gate/up (not views of a prepared bank) are read in place, by
the plan's step for raw weights (`plan.without_bank`): no copy of them outlives a call, so whatever
the caller writes into them between calls is what the next call computes with.

A call runs its plan in three steps: the routes (row-block aligned buffers, or per-expert lists for
``gluon_routed``), one launcher from ``_LAUNCHERS`` (a table keyed by the plan's variant: no code
path picks a kernel the plan did not name), and the sum of each token's K route rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import triton
from torch import Tensor

from magi2_core.backend import Feature, InvalidValueError, Plan, Problem, config

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
from .gluon import launch_gluon, launch_gluon_routed
from .kernels import fused_expert_kernel, gemm1_swiglu7_kernel, gemm2_weighted_kernel, topk_sum_kernel
from .operands import Operands, kernel_operands, row_blocks
from .pack import interleaved_bank, pack_w13
from .plan import device_id, plan_for, plan_reason, rows_for, without_bank
from .tiles import TENSOR_DESCRIPTORS, VARIANTS, Alignment, GemmTile, Launch, Variant, launch_of
from .tma import launch_tma


class MoEState:
    """Reusable route buffers (no weights: raw gate/up are never cached, see the module docstring).

    Layers called in turn share the route
    buffers: they are rewritten by every call before they are read, so they are allocated outside
    inference mode: an inference tensor cannot be written by a later call under ``no_grad`` (a normal
    tensor can be written under either).
    """

    def __init__(self) -> None:
        self._routes: RouteBuffers | None = None
        self._lists: ExpertLists | None = None
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


# Shared by plain calls: route buffers only, reallocated when a call needs other sizes.
_DEFAULT_STATE = MoEState()

_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _problem(
    device: torch.device,
    dtype: torch.dtype,
    deterministic: bool,
    tokens: int,
    heads: int,
    flat_experts: int,
    topk: int,
    d: int,
    inter: int,
) -> Problem:
    return Problem(
        op="moe_experts",
        device_type=device.type,
        device_index=device.index,
        dtype=_DTYPE_NAMES[dtype],
        features=frozenset({Feature.DETERMINISTIC} if deterministic else ()),
        tokens=tokens,
        num_heads=heads,
        num_experts=flat_experts // heads,
        top_k=topk,
        hidden=d,
        intermediate=inter,
    )


def call_problem(x: Tensor, idx: Tensor, w_gate: Tensor, deterministic: bool) -> Problem:
    """The :class:`Problem` of a call with these tensors (what the plan rows are evaluated on)."""
    t, heads, d = x.shape
    return _problem(x.device, x.dtype, deterministic, t, heads, w_gate.shape[0], idx.shape[2], d, w_gate.shape[2])


@functools.lru_cache(maxsize=256)
def _planned(
    device: torch.device,
    dtype: torch.dtype,
    deterministic: bool,
    interpreting: bool,
    raw: bool,
    tokens: int,
    heads: int,
    flat_experts: int,
    topk: int,
    d: int,
    inter: int,
) -> tuple[Plan, Launch]:
    """The plan of a call of this shape (``interpreting`` is part of the key: the alignment depends on it);
    ``raw``: gate/up are not views of a packed bank, so the plan's step for raw weights applies."""
    problem = _problem(device, dtype, deterministic, tokens, heads, flat_experts, topk, d, inter)
    dev = device_id(device.type, device.index)
    plan, launch = plan_for(problem, dev, *rows_for(dev))
    return without_bank(plan, problem, dev) if raw else (plan, launch)


# The plan of a shape follows the active profile: re-read after magi2_core.reload_config().
config.on_reload(_planned.cache_clear)


@dataclass
class FusedRun:
    """Everything one forward produced; the intermediates are exposed for stage tests."""

    y: Tensor  # [T, Hl, d] in x's dtype
    inter: Tensor | None  # [capacity, I] by aligned slot (rows of sentinel slots unwritten)
    routed: Tensor | None  # [R, d] per route, r = (h*T + t)*K + k
    buffers: RouteBuffers | None
    plan: Plan | None  # the plan that ran (None: no routes, nothing launched)


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


def _align(idx: Tensor, experts_per_head: int, bufs: RouteBuffers, alignment: Alignment) -> None:
    """Fill ``bufs`` for this call's routes with ``alignment`` (`tiles.py` names them)."""
    if alignment == "stable_kernels":
        align_routes_device_stable(idx, experts_per_head, bufs)
    elif alignment == "atomic":
        align_routes_device(idx, experts_per_head, bufs)
    else:
        align_routes_stable(flat_route_experts(idx, experts_per_head), bufs.counts.numel(), bufs)


def run_plan(
    x: Tensor,
    probs: Tensor,
    idx: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    plan: Plan,
    *,
    state: MoEState | None = None,
    deterministic: bool = False,
) -> Tensor:
    """`fused_moe_experts` with an explicit ``plan`` (what `magi2 tune` times): refused, with the reason,
    where the plan cannot run this call correctly here."""
    problem = call_problem(x, idx, w_gate, deterministic)
    reason = plan_reason(plan, problem, device_id(x.device.type, x.device.index))
    if reason is not None:
        raise InvalidValueError(
            "moe_experts", "plan", "a plan that can run this call here", f"{plan.describe()} ({reason})"
        )
    return run_fused(x, probs, idx, w_gate, w_up, w_down, state=state, plan=plan, deterministic=deterministic).y


def run_fused(
    x: Tensor,
    probs: Tensor,
    idx: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
    *,
    state: MoEState | None = None,
    plan: Plan | None = None,
    deterministic: bool = False,
) -> FusedRun:
    """The forward of `fused_moe_experts`: the call's plan (`plan.py`), or ``plan``, executed as it is.

    An explicit ``plan`` is not checked against the call here (`run_plan` checks it); the launchers
    refuse a kernel they cannot run, with the reason. The one change to a plan is the plan's own step
    for raw gate/up (`plan.without_bank`), which the returned `FusedRun.plan` shows: always for the
    call's own plan, and for an explicit one under CUDA-graph capture; outside a capture, an explicit
    plan that reads a bank gets one packed for this call alone.
    """
    state = _DEFAULT_STATE if state is None else state
    num_tokens, heads, d = x.shape
    topk = idx.shape[2]
    num_experts = w_gate.shape[0]
    inter_dim = w_gate.shape[2]
    dtype = x.dtype
    y = torch.empty((num_tokens, heads, d), dtype=dtype, device=x.device)
    num_routes = heads * num_tokens * topk
    if num_routes == 0:
        return FusedRun(y.zero_(), None, None, None, None)
    interp = _interpreting()
    w13 = interleaved_bank(w_gate, w_up)  # prepared weights: views of a packed bank, read in place
    capturing = x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if plan is None:
        plan, launch = _planned(
            x.device, dtype, deterministic, interp, w13 is None, num_tokens, heads, num_experts, topk, d, inter_dim
        )
    else:
        launch = launch_of(plan)
        if w13 is None and capturing:
            # Nothing the graph reads may be owned by a buffer that outlives the capture's own pool.
            plan, launch = without_bank(
                plan, call_problem(x, idx, w_gate, deterministic), device_id(x.device.type, x.device.index)
            )
        elif w13 is None and (launch.packed_w13 or launch.variant in TENSOR_DESCRIPTORS):
            w13 = pack_w13(w_gate, w_up)  # this call's own bank: an explicit plan runs as given
    # The interpreter multiplies raw BF16 bits in tl.dot (hence FP32 operands there), and its FP32 -> BF16
    # cast truncates (hence rounding by hand). FP32 activations: IEEE dots (the default would be TF32).
    upcast = interp or dtype == torch.float32
    rne = interp and dtype == torch.bfloat16
    x = x.contiguous() if x.stride(2) != 1 else x
    w_down = w_down.contiguous()
    probs_flat = probs.reshape(-1).to(torch.float32)

    single = launch.single
    if single is not None and (d & (d - 1) != 0 or inter_dim % single.block_i != 0):
        raise InvalidValueError(
            "moe_experts",
            "plan.variant",
            f"two_kernel here (the one-kernel path holds a power-of-two hidden and whole {single.block_i}-wide slices)",
            f"{plan.variant} for hidden {d}, intermediate {inter_dim}",
        )
    if w13 is not None:
        wg, wu = w13, w13[:, 1:, :]
        w_strides = (w13.stride(0), w13.stride(2), 2 * w13.stride(1))
    else:  # raw gate/up in place (a non-contiguous pair is copied for this call)
        wg, wu = w_gate.contiguous(), w_up.contiguous()
        w_strides = (wg.stride(0), wg.stride(1), wg.stride(2))

    routed = torch.empty((num_routes, d), dtype=dtype, device=x.device)
    routes: RouteBuffers | ExpertLists
    if launch.align == "lists":  # one program per expert over unpadded route lists (gluon_routed)
        tk = num_routes // heads
        if capturing:
            routes = ExpertLists.allocate(num_experts, tk, x.device)
        else:
            routes = state.expert_lists(num_experts, tk, x.device)
        expert_lists_device(idx, num_experts // heads, routes)
    else:  # the alignment's row block is the block of the kernels that read it
        block_m = launch.block_m
        if capturing:
            capacity = route_capacity(num_routes, num_experts, block_m)
            routes = RouteBuffers.allocate(capacity, block_m, num_experts, x.device)
        else:
            routes = state.route_buffers(num_routes, num_experts, block_m, x.device)
        _align(idx, num_experts // heads, routes, launch.align)
    ops = Operands(x, wg, wu, w13, w_down, w_strides, probs_flat, routed, topk, upcast, rne)
    inter = _LAUNCHERS[launch.variant](ops, launch, routes)
    _topk_sum(routed, y, heads, num_tokens, d, topk, rne)
    return FusedRun(y, inter, routed, routes if isinstance(routes, RouteBuffers) else None, plan)


def _launch_one_kernel(ops: Operands, launch: Launch, routes: RouteBuffers | ExpertLists) -> None:
    tile, bufs, x = launch.single, row_blocks(routes), ops.x
    assert tile is not None
    fused_expert_kernel[(bufs.capacity // tile.block_m,)](
        *kernel_operands(ops, (ops.wg, ops.wu, ops.w_down), bufs),
        *ops.w_strides,
        D=x.shape[2],
        INTER=ops.w_down.shape[1],
        TOPK=ops.topk,
        BLOCK_M=tile.block_m,
        BLOCK_I=tile.block_i,
        INTERLEAVED=ops.w13 is not None and launch.interleaved_dot,
        UPCAST_DOT=ops.upcast,
        EXPLICIT_RNE=ops.rne,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )


def _launch_two_kernel(ops: Operands, launch: Launch, routes: RouteBuffers | ExpertLists) -> Tensor:
    assert launch.gemms is not None
    t1, t2 = launch.gemms
    bufs, x = row_blocks(routes), ops.x
    d, inter_dim, num_routes = x.shape[2], ops.w_down.shape[1], ops.routed.shape[0]
    num_blocks_m = bufs.capacity // launch.block_m
    inter = torch.empty((bufs.capacity, inter_dim), dtype=x.dtype, device=x.device)
    gemm1_swiglu7_kernel[(num_blocks_m * triton.cdiv(inter_dim, t1.block_n),)](
        x,
        ops.wg,
        ops.wu,
        inter,
        bufs.sorted_ids,
        bufs.expert_ids,
        bufs.num_padded,
        x.shape[0],
        num_routes,
        num_blocks_m,
        x.stride(0),
        x.stride(1),
        *ops.w_strides,
        TOPK=ops.topk,
        **_gemm_meta(ops, t1, d, inter_dim),
    )
    gemm2_weighted_kernel[(num_blocks_m * triton.cdiv(d, t2.block_n),)](
        inter,
        ops.w_down,
        ops.probs,
        ops.routed,
        bufs.sorted_ids,
        bufs.expert_ids,
        bufs.num_padded,
        num_routes,
        num_blocks_m,
        **_gemm_meta(ops, t2, d, inter_dim),
    )
    return inter


def _gemm_meta(ops: Operands, tile: GemmTile, d: int, inter_dim: int) -> dict[str, int | bool]:
    """The compile-time arguments and launch sizes both GEMMs of the two-kernel path take."""
    return {
        "D": d,
        "INTER": inter_dim,
        "BLOCK_M": tile.block_m,
        "BLOCK_N": tile.block_n,
        "BLOCK_K": tile.block_k,
        "GROUP_M": tile.group_m,
        "UPCAST_DOT": ops.upcast,
        "EXPLICIT_RNE": ops.rne,
        "num_warps": tile.num_warps,
        "num_stages": tile.num_stages,
    }


# The variants' launchers (tiles.py names the variants, plan.py says which can serve a call): the plan
# picks a row, this table runs it; two_kernel returns its intermediate, which FusedRun keeps.
_LAUNCHERS: dict[Variant, Callable[[Operands, Launch, RouteBuffers | ExpertLists], Tensor | None]] = {
    "two_kernel": _launch_two_kernel,
    "one_kernel": _launch_one_kernel,
    "tma": launch_tma,
    "gluon": launch_gluon,
    "gluon_ws": launch_gluon,
    "gluon_routed": launch_gluon_routed,
}
assert set(_LAUNCHERS) == set(VARIANTS), "every variant of tiles.py has a launcher"


def _topk_sum(routed: Tensor, y: Tensor, heads: int, num_tokens: int, d: int, topk: int, rne: bool) -> None:
    """y[t, h] = the K route rows of (h, t) summed in FP32 in k order, one rounding."""
    rows = heads * num_tokens
    block_r = 16 if _interpreting() else 8
    topk_sum_kernel[(triton.cdiv(rows, block_r),)](
        routed,
        y,
        rows,
        num_tokens,
        y.stride(0),
        y.stride(1),
        D=d,
        TOPK=topk,
        BLOCK_R=block_r,
        BLOCK_D=triton.next_power_of_2(d),
        EXPLICIT_RNE=rne,
    )
