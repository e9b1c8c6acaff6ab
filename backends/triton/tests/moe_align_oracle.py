"""The route-alignment contract of `magi2_backend_triton.moe.align` stated in torch, for the tests."""

from __future__ import annotations

import torch
from magi2_backend_triton.moe.align import RouteBuffers
from torch import Tensor


def align_routes(rid: Tensor, num_experts: int, buffers: RouteBuffers) -> RouteBuffers:
    """Readable torch statement of the alignment contract (the tests cross-check the kernels with it).

    Fills `buffers` for the flat expert ids `rid` ([R] int32); returns the same buffers.

    sorted_ids[start_e + j] = the j-th route of expert e (plain, not stable, order), rows
    [start_e + n_e, start_e + P_e) hold the sentinel R; expert_ids[b] = #{e : cumsum(P)_e <= b*BM}.
    """
    bm = buffers.block_m
    num_routes = rid.numel()
    device = rid.device
    counts = torch.zeros(num_experts, dtype=torch.int32, device=device)
    counts.index_add_(0, rid, torch.ones_like(rid))
    padded = torch.div(counts + (bm - 1), bm, rounding_mode="floor").mul_(bm)
    padded_end = torch.cumsum(padded, 0, dtype=torch.int32)
    # Where an expert's routes land: its padded start minus its start in the unpadded sorted order.
    shift = (padded_end - padded) - (torch.cumsum(counts, 0, dtype=torch.int32) - counts)
    sorted_experts, order = torch.sort(rid)
    dest = shift[sorted_experts.long()].long() + torch.arange(num_routes, device=device)
    buffers.sorted_ids.fill_(num_routes)
    buffers.sorted_ids[dest] = order.to(torch.int32)
    block_starts = torch.arange(0, buffers.capacity, bm, device=device, dtype=torch.int32)
    torch.searchsorted(padded_end, block_starts, right=True, out_int32=True, out=buffers.expert_ids)
    if num_experts > 0:
        buffers.num_padded.copy_(padded_end[-1:])
    else:
        buffers.num_padded.zero_()
    return buffers
