"""Expert-parallel head-routed MoE (operators.md §3.1): heads sharded over ranks, tokens all-to-all'd.

MoE "heads" are hidden-state slices, each with its own bank of E experts, routed independently;
so sharding by heads needs no cross-rank reduction. Heads are padded to a multiple of the EP size
and every rank owns ``Hl = ceil(H / EP)`` contiguous heads; the trailing padded ("phantom") heads
have zero weights, are never sent over the wire, never computed, and produce no output.

Per call: an all-to-all sends each rank the slices of ALL tokens for the heads it owns, the rank
routes (:func:`magi2_core.moe_route`) and runs :func:`magi2_core.moe_experts` on them (whatever
provider resolution picks for the local problem), and the inverse all-to-all brings
``[T_local, H, d]`` back. Because each head's computation sees the same tokens in the same order as
in a single-process call, the result equals the single-process result of the same provider whenever
that provider's per-head arithmetic does not depend on the other heads (the reference's does not).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from magi2_core.distributed._a2a import ShardPlan, exchange_token_counts, group_rank_world
from magi2_core.errors import InvalidShapeError
from magi2_core.ops import moe_experts, moe_route

__all__ = ["ep_head_counts", "ep_local_heads", "ep_moe", "ep_moe_local", "ep_plan", "ep_slice"]


def _check_world(op: str, rank: int, world: int, num_heads: int) -> None:
    if world < 1 or not 0 <= rank < world:
        raise InvalidShapeError(op, "rank", f"in [0, {world}) with world >= 1", f"rank {rank}, world {world}")
    if num_heads < 1:
        raise InvalidShapeError(op, "num_heads", ">= 1", repr(num_heads))


def ep_local_heads(num_heads: int, world: int) -> int:
    """Heads per rank, phantom heads included: ``ceil(num_heads / world)`` (12 heads, EP4 -> 3; EP5 -> 3)."""
    return -(-num_heads // world)


def ep_head_counts(num_heads: int, world: int) -> tuple[int, ...]:
    """Real (non-phantom) heads per rank: ``Hl`` each until the heads run out (12, EP5 -> 3,3,3,3,0)."""
    hl = ep_local_heads(num_heads, world)
    return tuple(max(0, min(hl, num_heads - r * hl)) for r in range(world))


def ep_slice(weight: torch.Tensor, rank: int, world: int, num_heads: int, experts: int) -> torch.Tensor:
    """The checkpoint slicing rule: rows ``[rank·Hl·E, (rank+1)·Hl·E)`` of a head-major parameter.

    ``weight`` is any parameter whose dim 0 is ``num_heads·experts`` (router ``[H·E, d]``, biases
    ``[H·E]``, ``w_gate``/``w_up`` ``[H·E, d, I]``, ``w_down`` ``[H·E, I, d]``). Returns a new
    contiguous ``[Hl·E, ...]`` tensor; rows of phantom heads (past ``H·E``) are zero.
    """
    _check_world("ep_slice", rank, world, num_heads)
    if weight.dim() < 1 or weight.shape[0] != num_heads * experts:
        raise InvalidShapeError(
            "ep_slice",
            "weight",
            f"dim 0 of size num_heads·experts = {num_heads * experts}",
            f"shape {list(weight.shape)}",
        )
    rows = ep_local_heads(num_heads, world) * experts
    start = rank * rows
    real = max(0, min(start + rows, num_heads * experts) - start)
    out = weight.new_zeros((rows, *weight.shape[1:]))
    out[:real] = weight[start : start + real]
    return out


def ep_plan(
    num_heads: int,
    tokens_local: int,
    *,
    group: dist.ProcessGroup | None = None,
    tokens: tuple[int, ...] | None = None,
    device: torch.device | None = None,
) -> ShardPlan:
    """The all-to-all plan of one EP call. ``tokens`` (every rank's local count) skips the size
    exchange; otherwise the counts are all-gathered on ``device`` (CUDA for NCCL, CPU for gloo)."""
    rank, world = group_rank_world(group)
    _check_world("ep_moe", rank, world, num_heads)
    if tokens is None:
        tokens = tuple(c[0] for c in exchange_token_counts((tokens_local,), group, device or torch.device("cpu")))
    if len(tokens) != world or tokens[rank] != tokens_local:
        raise InvalidShapeError(
            "ep_moe", "tokens", f"{world} per-rank counts with tokens[{rank}] == {tokens_local}", repr(tokens)
        )
    return ShardPlan(rank, world, ep_head_counts(num_heads, world), tuple(tokens), group)


def ep_moe_local(
    x_local: torch.Tensor,
    plan: ShardPlan,
    router_weight: torch.Tensor,
    bias: torch.Tensor | None,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    top_k: int = 6,
    route_scale: float = 4.9,
    deterministic: bool | None = None,
    route_provider: str | None = None,
    experts_provider: str | None = None,
) -> torch.Tensor:
    """The compute between the two all-to-alls: ``[T_total, n_real, d] -> [T_total, n_real, d]``.

    The weights are this rank's :func:`ep_slice` (``Hl·E`` rows); only the rows of its real heads
    are used, so phantom heads cost nothing.
    """
    t, n, d = x_local.shape
    hl = ep_local_heads(plan.num_heads, plan.world)
    if router_weight.dim() != 2 or router_weight.shape[0] % hl != 0:
        raise InvalidShapeError(
            "ep_moe", "router_weight", f"this rank's ep_slice: [{hl}·E, {d}]", f"shape {list(router_weight.shape)}"
        )
    if n == 0 or t == 0:
        return x_local.new_empty(t, n, d)
    rows = n * (router_weight.shape[0] // hl)
    probs, idx = moe_route(
        x_local,
        router_weight[:rows],
        None if bias is None else bias[:rows],
        top_k=top_k,
        route_scale=route_scale,
        provider=route_provider,
    )
    return moe_experts(
        x_local,
        probs,
        idx,
        w_gate[:rows],
        w_up[:rows],
        w_down[:rows],
        deterministic=deterministic,
        provider=experts_provider,
    )


def ep_moe(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor | None,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    top_k: int = 6,
    route_scale: float = 4.9,
    group: dist.ProcessGroup | None = None,
    tokens: tuple[int, ...] | None = None,
    deterministic: bool | None = None,
    route_provider: str | None = None,
    experts_provider: str | None = None,
) -> torch.Tensor:
    """Expert-parallel MoE: this rank's tokens ``x [T_local, H, d]`` -> ``y [T_local, H, d]``.

    ``router_weight``/``bias``/``w_*`` are this rank's shards, ``ep_slice(full, rank, world, H, E)``.
    ``tokens``: every rank's ``T_local`` in rank order (counts may differ; omitted: exchanged, one
    small collective and a host sync). ``group``: the EP group (default: the world; no
    torch.distributed: a plain single-device call). The other arguments are those of
    :func:`magi2_core.moe_route` / :func:`magi2_core.moe_experts`.
    """
    if x.dim() != 3:
        raise InvalidShapeError("ep_moe", "x", "[T_local, heads, hidden]", f"shape {list(x.shape)}")
    plan = ep_plan(x.shape[1], x.shape[0], group=group, tokens=tokens, device=x.device)
    x_local = plan.scatter_heads(x)
    y_local = ep_moe_local(
        x_local,
        plan,
        router_weight,
        bias,
        w_gate,
        w_up,
        w_down,
        top_k=top_k,
        route_scale=route_scale,
        deterministic=deterministic,
        route_provider=route_provider,
        experts_provider=experts_provider,
    )
    return plan.gather_heads(y_local)
