"""vllm-omni's MoE layer (magi2_core.integrations.vllm_omni) under expert parallelism on gloo CPU ranks.

Each rank loads the FULL checkpoint through the layer's own ``ep_slice`` hook (as vllm-omni's loader
does) and must reproduce, bit for bit, the single-process layer's output for its tokens (head
sharding with the all-to-all) or for its heads (tensor-parallel layout, no exchange). Three heads on
two ranks leave rank 1 a phantom head. Token totals are multiples of 8 for the reason given in
test_ep_moe.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_harness import run_world

from magi2_core.integrations.vllm_omni import EPGroup, Magi2MultiHeadMoE, Magi2MultiHeadMoEConfig

HEADS, D, E, K, INTER = 3, 16, 8, 2, 24


def _layer(group: EPGroup, dtype: torch.dtype) -> Magi2MultiHeadMoE:
    cfg = Magi2MultiHeadMoEConfig(HEADS * D, HEADS, E, K, INTER, dtype, route_scale=4.9)
    return Magi2MultiHeadMoE(cfg, ep_group=group)


def _checkpoint(dtype: torch.dtype, g: torch.Generator) -> dict[str, torch.Tensor]:
    full = _layer(EPGroup(), dtype).state_dict()
    return {n: (torch.randn(t.shape, generator=g, dtype=torch.float64) * 0.3).to(t.dtype) for n, t in full.items()}


@torch.no_grad()  # magi2 ops are forward-only: parameters that require grad are refused outside no_grad
def _worker(rank: int, world: int, tokens: tuple[int, ...], replicated: bool) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(11)  # the same checkpoint and tokens on every rank
        ckpt = _checkpoint(dtype, g)
        x = (torch.randn(sum(tokens), HEADS * D, generator=g, dtype=torch.float64)).to(dtype)
        single = _layer(EPGroup(), dtype)
        single.load_state_dict(ckpt)
        expected = single(x)

        layer = _layer(EPGroup(dist.group.WORLD, world, rank, replicated_sequence=replicated), dtype)
        layer.load_state_dict({n: layer.ep_slice(t) for n, t in ckpt.items()})
        hl = layer.local_num_heads
        if replicated:  # every rank has all tokens, only its heads (phantom columns stay zero)
            cols = slice(rank * hl * D, min((rank + 1) * hl, HEADS) * D)
            mine = torch.zeros(sum(tokens), hl * D, dtype=dtype)
            mine[:, : cols.stop - cols.start] = x[:, cols]
            y = layer(mine)
            assert torch.equal(y[:, : cols.stop - cols.start], expected[:, cols]), f"rank {rank} {dtype}"
            assert not y[:, cols.stop - cols.start :].any()
        else:
            start = sum(tokens[:rank])
            rows = slice(start, start + tokens[rank])
            y = layer(x[rows])
            assert y.shape == (tokens[rank], HEADS * D)
            assert torch.equal(y, expected[rows]), f"rank {rank} {dtype}: max |diff| {(y - expected[rows]).abs().max()}"


@pytest.mark.parametrize(
    ("tokens", "replicated"),
    [((8, 16), False), ((24, 0), False), ((24, 24), True)],
    ids=["ep-uneven", "ep-empty-rank", "tp-replicated"],
)
def test_ep_layer_equals_single_process(tokens: tuple[int, ...], replicated: bool) -> None:
    run_world(2, _worker, tokens, replicated)


def test_ep_slice_keeps_views_for_real_rows_and_pads_phantom_heads() -> None:
    ckpt = torch.randn(HEADS * E, D)
    rank0 = _layer(EPGroup(None, 2, 0), torch.float32)
    rank1 = _layer(EPGroup(None, 2, 1), torch.float32)
    s0, s1 = rank0.ep_slice(ckpt), rank1.ep_slice(ckpt)
    assert s0.data_ptr() == ckpt.data_ptr() and torch.equal(s0, ckpt[: 2 * E])  # a view: mmap stays lazy
    assert torch.equal(s1[:E], ckpt[2 * E :]) and not s1[E:].any()  # one real head, one zero phantom head
    assert rank0.ep_slice(s0) is s0  # already local
    with pytest.raises(ValueError, match="dim 0 of 24"):
        rank0.ep_slice(ckpt[:5])
