"""Ulysses sequence-parallel attention (operators.md §2.6): scatter heads, gather sequence, attend, invert.

Every rank holds its own contiguous run of the packed sequence, ``q [T_local, Hq, D]`` and
``k``/``v`` ``[T_local_k, Hkv, D]``; concatenated in rank order they form the global packed sequence
that the caller's global ``cu_seqlens`` describe. An all-to-all gives every rank the whole sequence
for ``Hq/world`` contiguous heads (and ``Hkv/world`` kv heads, which keeps the GQA grouping), the
sinks are cut to the same head slice, :func:`magi2_core.attention` runs locally, and the inverse
all-to-all returns ``[T_local, Hq, D]``. Attention is independent per head, so the result equals the
single-process call of the same provider whenever its per-head arithmetic does not depend on the
head count (the reference's does not).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from magi2_core.distributed._a2a import ShardPlan, exchange_token_counts, group_rank_world
from magi2_core.errors import InvalidShapeError
from magi2_core.model.kernel import SinkRescale
from magi2_core.ops import attention

__all__ = ["UlyssesPlans", "ulysses_attention", "ulysses_plans"]

OP = "ulysses_attention"


class UlyssesPlans:
    """The all-to-all plans of one Ulysses call: ``q`` (queries, output, LSE) and ``kv``."""

    def __init__(self, q: ShardPlan, kv: ShardPlan) -> None:
        self.q = q
        self.kv = kv

    def head_slice(self) -> slice:
        """This rank's query heads, for cutting per-head parameters such as the sinks."""
        start = self.q.head_starts[self.q.rank]
        return slice(start, start + self.q.local_heads)


def ulysses_plans(
    num_q_heads: int,
    num_kv_heads: int,
    tokens_q_local: int,
    tokens_k_local: int,
    *,
    group: dist.ProcessGroup | None = None,
    tokens_q: tuple[int, ...] | None = None,
    tokens_k: tuple[int, ...] | None = None,
    device: torch.device | None = None,
) -> UlyssesPlans:
    """Plans for one call; raises :class:`InvalidShapeError` unless ``world`` divides both head counts.

    ``tokens_q``/``tokens_k``: every rank's local counts (given: no exchange; omitted: one small
    all-gather on ``device`` and a host sync).
    """
    rank, world = group_rank_world(group)
    for arg, h in (("q", num_q_heads), ("k", num_kv_heads)):
        if h < 1 or h % world != 0:
            raise InvalidShapeError(OP, arg, f"a head count divisible by the Ulysses world size {world}", f"{h} heads")
    if tokens_q is None or tokens_k is None:
        counts = exchange_token_counts((tokens_q_local, tokens_k_local), group, device or torch.device("cpu"))
        tokens_q = tokens_q if tokens_q is not None else tuple(c[0] for c in counts)
        tokens_k = tokens_k if tokens_k is not None else tuple(c[1] for c in counts)
    for arg, given, local in (("tokens_q", tokens_q, tokens_q_local), ("tokens_k", tokens_k, tokens_k_local)):
        if len(given) != world or given[rank] != local:
            raise InvalidShapeError(OP, arg, f"{world} per-rank counts with entry {rank} == {local}", repr(given))
    return UlyssesPlans(
        ShardPlan(rank, world, (num_q_heads // world,) * world, tuple(tokens_q), group),
        ShardPlan(rank, world, (num_kv_heads // world,) * world, tuple(tokens_k), group),
    )


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    tokens_q: tuple[int, ...] | None = None,
    tokens_k: tuple[int, ...] | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    softmax_scale: float | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    deterministic: bool = False,
    return_lse: bool = False,
    sink_rescale: SinkRescale = "fp32",
    provider: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Ulysses attention: this rank's ``q [T_local, Hq, D]`` -> ``o [T_local, Hq, D]``.

    ``cu_seqlens_q``/``cu_seqlens_k`` are the GLOBAL prefix sums of the packed sequence formed by
    the ranks' tokens in rank order (uneven splits allowed; a split may cut a segment). ``sinks``:
    the full FP32 ``[S, Hq]``; each rank uses its own head slice. With ``return_lse`` also returns
    this rank's ``lse [Hq, T_local]`` FP32. ``group``: the Ulysses group (default: the world; no
    torch.distributed: a plain :func:`magi2_core.attention` call). Other arguments: as
    :func:`magi2_core.attention`.
    """
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise InvalidShapeError(OP, arg, "[T_local, heads, head_dim]", f"shape {list(t.shape)}")
    if v.shape[:2] != k.shape[:2]:
        raise InvalidShapeError(OP, "v", f"[{k.shape[0]}, {k.shape[1]}, ...] like k", f"shape {list(v.shape)}")
    plans = ulysses_plans(
        q.shape[1],
        k.shape[1],
        q.shape[0],
        k.shape[0],
        group=group,
        tokens_q=tokens_q,
        tokens_k=tokens_k,
        device=q.device,
    )
    if sinks is not None:
        if sinks.dim() != 2 or sinks.shape[1] != q.shape[1]:
            raise InvalidShapeError(
                OP, "sinks", f"FP32 [S, {q.shape[1]}] (all query heads)", f"shape {list(sinks.shape)}"
            )
        sinks = sinks[:, plans.head_slice()].contiguous()
    q_l = plans.q.scatter_heads(q)
    k_l = plans.kv.scatter_heads(k)
    v_l = plans.kv.scatter_heads(v)
    o_l, lse_l = attention(
        q_l,
        k_l,
        v_l,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=softmax_scale,
        softcap=softcap,
        sinks=sinks,
        deterministic=deterministic,
        return_lse=True,
        sink_rescale=sink_rescale,
        provider=provider,
    )
    o = plans.q.gather_heads(o_l)
    if not return_lse:
        return o
    # lse is head-major [Hq/world, T_total]; token-major rows make each rank's block contiguous.
    lse = plans.q.gather_heads(lse_l.t().contiguous()).t().contiguous()
    return o, lse
