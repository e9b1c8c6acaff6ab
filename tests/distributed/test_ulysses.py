"""Ulysses attention on gloo CPU ranks equals the single-process attention of the same provider, bit for bit.

Segment lengths are multiples of 8 and the total a multiple of 64: torch's CPU ``exp`` takes a SIMD
path for whole vectors and another for a tensor's tail, which can differ in the last bit; with these
sizes no head's block of the reference's score matrix or LSE falls in a tail whatever the head
count, so sharded and single-process calls run the same arithmetic per head. The rank splits are
free (they cut segments and leave a rank empty).
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_world

import magi2_core as m2
from magi2_core.distributed import ulysses_attention, ulysses_plans
from magi2_core.errors import InvalidShapeError

D = 16
SEGMENTS = (16, 40, 8)  # global packed sequence, T = 64
SEEDS = (3, 17, 2024)
REF = "reference"


def _worker(rank: int, world: int, hq: int, hkv: int, tokens: tuple[int, ...], pass_tokens: bool) -> None:
    assert sum(tokens) == sum(SEGMENTS)
    cu = torch.tensor([0, *torch.tensor(SEGMENTS).cumsum(0).tolist()], dtype=torch.int32)
    t0, t1 = sum(tokens[:rank]), sum(tokens[: rank + 1])
    counts = tokens if pass_tokens else None
    for dtype in (torch.float32, torch.bfloat16):
        for seed in SEEDS:
            g = torch.Generator().manual_seed(seed)
            q, k, v = (
                torch.randn(sum(tokens), h, D, generator=g, dtype=torch.float64).to(dtype) for h in (hq, hkv, hkv)
            )
            sinks = torch.randn(2, hq, generator=g)
            softcap = 0.0 if seed == 3 else 20.0
            o_ref, lse_ref = m2.attention(q, k, v, cu, cu, sinks=sinks, softcap=softcap, return_lse=True, provider=REF)
            o, lse = ulysses_attention(
                q[t0:t1],
                k[t0:t1],
                v[t0:t1],
                cu,
                cu,
                sinks=sinks,
                softcap=softcap,
                tokens_q=counts,
                tokens_k=counts,
                return_lse=True,
                provider=REF,
            )
            assert o.shape == (t1 - t0, hq, D) and o.dtype == dtype and lse.shape == (hq, t1 - t0)
            assert torch.equal(o, o_ref[t0:t1]), f"rank {rank} {dtype} seed {seed}: {(o - o_ref[t0:t1]).abs().max()}"
            assert torch.equal(lse, lse_ref[:, t0:t1])
            o_plain = ulysses_attention(q[t0:t1], k[t0:t1], v[t0:t1], cu, cu, provider=REF)
            assert torch.equal(o_plain, m2.attention(q, k, v, cu, cu, provider=REF)[t0:t1])
    # head counts the world does not divide: every rank refuses before any collective runs
    with pytest.raises(InvalidShapeError, match="divisible by the Ulysses world size"):
        ulysses_attention(torch.randn(1, world + 1, D), torch.randn(1, world, D), torch.randn(1, world, D), cu, cu)
    with pytest.raises(InvalidShapeError, match="divisible by the Ulysses world size"):
        ulysses_plans(world, world + 1, 1, 1)


@pytest.mark.parametrize(
    ("world", "hq", "hkv", "tokens", "pass_tokens"),
    [
        (2, 6, 6, (21, 43), False),
        (3, 6, 6, (30, 0, 34), True),
        (2, 12, 6, (40, 24), True),  # GQA 2:1, each rank keeps whole kv groups
        (3, 12, 6, (9, 50, 5), False),
    ],
    ids=["w2", "w3-empty-rank", "w2-gqa", "w3-gqa"],
)
def test_ulysses_equals_single_process(
    world: int, hq: int, hkv: int, tokens: tuple[int, ...], pass_tokens: bool
) -> None:
    run_world(world, _worker, hq, hkv, tokens, pass_tokens)


def test_ulysses_without_process_group_is_the_single_device_call() -> None:
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = (torch.randn(12, 4, D) for _ in range(3))
    sinks = torch.randn(1, 4)
    assert torch.equal(
        ulysses_attention(q, k, v, cu, cu, sinks=sinks, provider=REF),
        m2.attention(q, k, v, cu, cu, sinks=sinks, provider=REF),
    )
    with pytest.raises(InvalidShapeError, match="sinks"):
        ulysses_attention(q, k, v, cu, cu, sinks=torch.randn(1, 3), provider=REF)
