"""Head-sharded all-to-all: the one exchange both scale-out layers are built on.

Every rank holds its own tokens with all heads, ``x [T_local, H, *rest]``. After
:meth:`ShardPlan.scatter_heads` every rank holds ALL tokens (concatenated in rank order, so the
global packing is preserved) for the heads it owns; :meth:`ShardPlan.gather_heads` is the inverse.
Each direction is one ``torch.distributed.all_to_all_single`` on a flat buffer with split sizes, so
token counts may differ between ranks and head counts too (expert parallelism leaves the last ranks
fewer real heads). Each direction costs exactly one local copy: the send side packs the head ranges
destination by destination; the receive side already lands in ``[T_total, H_rank, *rest]`` order;
on the way back the received blocks are written into their head ranges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from magi2_core.errors import InvalidShapeError

__all__ = ["ShardPlan", "exchange_token_counts", "group_rank_world"]


def group_rank_world(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """``(rank, world)`` in ``group``; ``(0, 1)`` when torch.distributed is not initialised.

    A process without a process group runs the layers as plain single-device calls.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def exchange_token_counts(
    counts: tuple[int, ...], group: dist.ProcessGroup | None, device: torch.device
) -> list[tuple[int, ...]]:
    """All-gather each rank's tuple of local token counts: ``result[rank] == that rank's counts``.

    One small collective (and one host sync); pass the counts to the layers to skip it.
    ``device`` must suit the backend (CUDA tensors for NCCL, CPU for gloo).
    """
    _, world = group_rank_world(group)
    if world == 1:
        return [counts]
    mine = torch.tensor(counts, dtype=torch.int64, device=device)
    out = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(out, mine, group=group)
    return [tuple(int(v) for v in t.tolist()) for t in out]


@dataclass(frozen=True)
class ShardPlan:
    """Who owns which heads and how many tokens each rank holds, for one all-to-all pair.

    ``head_counts[r]``: heads rank ``r`` owns (contiguous, in rank order, summing to ``H``);
    ``tokens[r]``: tokens rank ``r`` holds locally. Built identically on every rank.
    """

    rank: int
    world: int
    head_counts: tuple[int, ...]
    tokens: tuple[int, ...]
    group: dist.ProcessGroup | None = None

    @property
    def num_heads(self) -> int:
        return sum(self.head_counts)

    @property
    def local_heads(self) -> int:
        return self.head_counts[self.rank]

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens)

    @property
    def head_starts(self) -> tuple[int, ...]:
        starts = [0]
        for n in self.head_counts[:-1]:
            starts.append(starts[-1] + n)
        return tuple(starts)

    @property
    def token_start(self) -> int:
        """Offset of this rank's tokens in the gathered (global) sequence."""
        return sum(self.tokens[: self.rank])

    def _check(self, op: str, arg: str, x: torch.Tensor, tokens: int, heads: int, what: str) -> None:
        if x.dim() < 2 or x.shape[0] != tokens or x.shape[1] != heads:
            raise InvalidShapeError(op, arg, f"[{tokens}, {heads}, ...] ({what})", f"shape {list(x.shape)}")

    def scatter_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[tokens[rank], H, *rest] -> [total_tokens, local_heads, *rest]`` (all tokens, own heads)."""
        t = self.tokens[self.rank]
        self._check("scatter_heads", "x", x, t, self.num_heads, "this rank's tokens, all heads")
        if self.world == 1:
            return x
        rest = tuple(x.shape[2:])
        inner = math.prod(rest)
        send = x.new_empty(t * self.num_heads * inner)
        in_splits = []
        off = 0
        for start, n in zip(self.head_starts, self.head_counts, strict=True):
            size = t * n * inner
            send[off : off + size].view(t, n, *rest).copy_(x[:, start : start + n])
            in_splits.append(size)
            off += size
        out_splits = [tk * self.local_heads * inner for tk in self.tokens]
        out = x.new_empty(sum(out_splits))
        dist.all_to_all_single(out, send, out_splits, in_splits, group=self.group)
        return out.view(self.total_tokens, self.local_heads, *rest)

    def gather_heads(self, y: torch.Tensor) -> torch.Tensor:
        """``[total_tokens, local_heads, *rest] -> [tokens[rank], H, *rest]``: inverse of scatter_heads."""
        self._check("gather_heads", "y", y, self.total_tokens, self.local_heads, "all tokens, this rank's heads")
        if self.world == 1:
            return y
        t = self.tokens[self.rank]
        rest = tuple(y.shape[2:])
        inner = math.prod(rest)
        send = y.contiguous().view(-1)  # token blocks are contiguous row ranges: no packing needed
        in_splits = [tk * self.local_heads * inner for tk in self.tokens]
        out_splits = [t * n * inner for n in self.head_counts]
        recv = y.new_empty(sum(out_splits))
        dist.all_to_all_single(recv, send, out_splits, in_splits, group=self.group)
        out = y.new_empty(t, self.num_heads, *rest)
        off = 0
        for start, n, size in zip(self.head_starts, self.head_counts, out_splits, strict=True):
            out[:, start : start + n] = recv[off : off + size].view(t, n, *rest)
            off += size
        return out
