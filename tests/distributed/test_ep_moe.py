"""Expert-parallel MoE on gloo CPU ranks equals the single-process MoE of the same provider, bit for bit.

Why the token totals are multiples of 8 (with E = 8): torch's CPU sigmoid takes a SIMD path for
whole vectors and another for the tail of a tensor, and the two can differ in the last bit. The
reference router applies it to ``[heads, T, E]``; with ``T·E`` a multiple of 64 no head's block is
ever in a tail, whatever the head count, so the single-process and the sharded calls run the same
arithmetic per head. (With a ragged ``T·E`` the results differ by an ulp or so: a property of the
provider's elementwise kernels, not of the exchange, which the round-trip test checks bit-exactly
at any size.) How the tokens are split between the ranks is free.
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_world

import magi2_core as m2
from magi2_core.distributed import ep_head_counts, ep_local_heads, ep_moe, ep_plan, ep_slice
from magi2_core.errors import InvalidShapeError

E, D, INTER, K = 8, 16, 24, 3
SEEDS = (3, 17, 2024)
REF = "reference"  # both sides on the same provider: the exact CPU reference


def _weights(heads: int, dtype: torch.dtype, g: torch.Generator) -> dict[str, torch.Tensor]:
    def rnd(*shape: int, scale: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    return {
        "router_weight": rnd(heads * E, D, scale=0.5).float(),
        "bias": rnd(heads * E, scale=0.1).float(),
        "w_gate": rnd(heads * E, D, INTER, scale=D**-0.5).to(dtype),
        "w_up": rnd(heads * E, D, INTER, scale=D**-0.5).to(dtype),
        "w_down": rnd(heads * E, INTER, D, scale=INTER**-0.5).to(dtype),
    }


def _single(x: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    probs, idx = m2.moe_route(x, w["router_weight"], w["bias"], top_k=K, provider=REF)
    return m2.moe_experts(x, probs, idx, w["w_gate"], w["w_up"], w["w_down"], provider=REF)


def _ep_worker(rank: int, world: int, heads: int, tokens: tuple[int, ...], pass_tokens: bool) -> None:
    start = sum(tokens[:rank])
    for dtype in (torch.float32, torch.bfloat16):
        for seed in SEEDS:
            g = torch.Generator().manual_seed(seed)
            x = torch.randn(sum(tokens), heads, D, generator=g, dtype=torch.float64).to(dtype)
            w = _weights(heads, dtype, g)
            expected = _single(x, w)[start : start + tokens[rank]]
            local = {k: ep_slice(v, rank, world, heads, E) for k, v in w.items()}
            y = ep_moe(
                x[start : start + tokens[rank]],
                local["router_weight"],
                local["bias"],
                local["w_gate"],
                local["w_up"],
                local["w_down"],
                top_k=K,
                tokens=tokens if pass_tokens else None,
                route_provider=REF,
                experts_provider=REF,
            )
            assert y.dtype == dtype and y.shape == (tokens[rank], heads, D)
            assert torch.equal(y, expected), f"rank {rank} {dtype} seed {seed}: max |diff| {(y - expected).abs().max()}"


@pytest.mark.parametrize(
    ("world", "heads", "tokens", "pass_tokens"),
    [
        (2, 12, (13, 27), False),  # EP2: 6 heads a rank, uneven tokens exchanged
        (3, 12, (17, 0, 15), True),  # EP3: 4 heads a rank, a rank without tokens
        (5, 12, (5, 9, 0, 3, 15), False),  # EP5: Hl=3, 3 phantom heads, rank 4 owns only phantoms
        (2, 5, (11, 21), True),  # 5 heads on EP2: Hl=3, one phantom head on rank 1
    ],
    ids=["ep2-h12", "ep3-h12", "ep5-h12-phantom", "ep2-h5-phantom"],
)
def test_ep_moe_equals_single_process(world: int, heads: int, tokens: tuple[int, ...], pass_tokens: bool) -> None:
    run_world(world, _ep_worker, heads, tokens, pass_tokens)


def test_ep_layout_rule() -> None:
    assert ep_local_heads(12, 4) == 3 and ep_head_counts(12, 4) == (3, 3, 3, 3)
    assert ep_local_heads(12, 5) == 3 and ep_head_counts(12, 5) == (3, 3, 3, 3, 0)
    assert ep_head_counts(5, 2) == (3, 2) and ep_head_counts(12, 1) == (12,)


@pytest.mark.parametrize(("heads", "world"), [(12, 2), (12, 5), (5, 2), (4, 3)])
def test_ep_slice_rows_and_zero_padding(heads: int, world: int) -> None:
    w = torch.randn(heads * E, D, INTER)
    hl = ep_local_heads(heads, world)
    padded = torch.cat([w, torch.zeros((hl * world - heads) * E, D, INTER)])
    shards = [ep_slice(w, r, world, heads, E) for r in range(world)]
    assert all(s.shape == (hl * E, D, INTER) and s.is_contiguous() for s in shards)
    assert torch.equal(torch.cat(shards), padded)  # rows [r·Hl·E, (r+1)·Hl·E) of the padded weight
    b = torch.randn(heads * E)
    assert torch.equal(torch.cat([ep_slice(b, r, world, heads, E) for r in range(world)])[: heads * E], b)


def test_ep_slice_rejects_wrong_rows_and_rank() -> None:
    with pytest.raises(InvalidShapeError, match="num_heads·experts"):
        ep_slice(torch.randn(12 * E - 1, D), 0, 2, 12, E)
    with pytest.raises(InvalidShapeError, match="rank"):
        ep_slice(torch.randn(12 * E, D), 2, 2, 12, E)


def test_ep_moe_without_process_group_is_the_single_device_call() -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(19, 4, D, generator=g).bfloat16()
    w = _weights(4, torch.bfloat16, g)
    y = ep_moe(
        x,
        w["router_weight"],
        w["bias"],
        w["w_gate"],
        w["w_up"],
        w["w_down"],
        top_k=K,
        route_provider=REF,
        experts_provider=REF,
    )
    assert torch.equal(y, _single(x, w))
    with pytest.raises(InvalidShapeError, match="tokens"):
        ep_plan(4, 19, tokens=(18,))
