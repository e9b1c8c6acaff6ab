"""What a variant's launcher reads: the call's operands as the expert kernels take them.

`fused.run_fused` builds one :class:`Operands` per call and hands it, with the plan's `Launch` and the
aligned routes, to the launcher its table names for the plan's variant; every launcher has that one
signature. `kernel_operands` is the runtime argument list the one-kernel expert kernels share.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from .align import ExpertLists, RouteBuffers
from .tiles import Launch, SliceTile

__all__ = ["Operands", "bank", "kernel_operands", "row_blocks"]


class Operands(NamedTuple):
    """One call's operands: ``x`` [T, Hl, d]; ``w13``, the packed [F, 2I, d] bank, or None for raw
    gate/up in ``wg``/``wu`` with ``w_strides`` (expert, d, I); ``w_down``; the flat route weights
    ``probs``; the per-route output ``routed`` [R, d]; K; and the numeric flags (FP32 dot operands,
    rounding by hand)."""

    x: Tensor
    wg: Tensor
    wu: Tensor
    w13: Tensor | None
    w_down: Tensor
    w_strides: tuple[int, int, int]
    probs: Tensor
    routed: Tensor
    topk: int
    upcast: bool
    rne: bool


def bank(ops: Operands, launch: Launch) -> tuple[Tensor, SliceTile]:
    """The packed bank and slice tile that the descriptor variants need (the plan guarantees both)."""
    assert ops.w13 is not None and launch.single is not None, launch
    return ops.w13, launch.single


def row_blocks(routes: RouteBuffers | ExpertLists) -> RouteBuffers:
    """The routes of a row-block variant (every variant but ``gluon_routed``)."""
    assert isinstance(routes, RouteBuffers), "this variant reads row-block aligned routes"
    return routes


def kernel_operands(
    ops: Operands, weights: tuple[object, ...], routes: RouteBuffers | ExpertLists
) -> tuple[object, ...]:
    """The runtime arguments of a one-kernel expert kernel (one_kernel, tma, gluon, gluon_ws, gluon_routed),
    in the order they all take: x, its ``weights`` (tensors or descriptors), the route weights, the
    per-route output, the routes (row blocks: sorted ids, expert per block, padded count; lists: lists,
    counts, stride), then T, R and x's token and head strides."""
    x, routed = ops.x, ops.routed
    if isinstance(routes, RouteBuffers):
        read: tuple[object, ...] = (routes.sorted_ids, routes.expert_ids, routes.num_padded)
    else:
        read = (routes.lists, routes.counts, routes.stride)
    return (x, *weights, ops.probs, routed, *read, x.shape[0], routed.shape[0], x.stride(0), x.stride(1))
