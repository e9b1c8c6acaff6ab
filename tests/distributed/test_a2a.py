"""The head-sharded all-to-all moves data bit-exactly: scatter = slicing the global tensor; gather inverts it."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_world

from magi2_core.distributed import ShardPlan, ep_head_counts


def _worker(rank: int, world: int, heads: tuple[int, ...], tokens: tuple[int, ...]) -> None:
    plan = ShardPlan(rank, world, heads, tokens)
    h0 = sum(heads[:rank])
    t0 = sum(tokens[:rank])
    for dtype, rest in ((torch.float32, (5,)), (torch.bfloat16, (3, 2)), (torch.int64, ())):
        full = torch.randint(-1000, 1000, (sum(tokens), sum(heads), *rest), generator=torch.Generator().manual_seed(7))
        full = full.to(dtype)
        mine = full[t0 : t0 + tokens[rank]].contiguous()
        scattered = plan.scatter_heads(mine)
        assert torch.equal(scattered, full[:, h0 : h0 + heads[rank]])
        back = plan.gather_heads(scattered + 1)  # a changed payload must come back to the right rows
        assert torch.equal(back, mine + 1)
        assert back.is_contiguous() and back.dtype == dtype


@pytest.mark.parametrize(
    ("world", "heads", "tokens"),
    [(2, (3, 3), (7, 0)), (3, (4, 4, 4), (1, 13, 6)), (3, ep_head_counts(4, 3), (5, 2, 9))],
    ids=["w2-even-heads", "w3-ragged-tokens", "w3-phantom-rank"],
)
def test_scatter_gather_round_trip(world: int, heads: tuple[int, ...], tokens: tuple[int, ...]) -> None:
    run_world(world, _worker, heads, tokens)
