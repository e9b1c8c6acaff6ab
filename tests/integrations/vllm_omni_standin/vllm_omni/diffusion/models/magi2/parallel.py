"""Stand-in for vllm-omni 0.30.0 ``vllm_omni/diffusion/models/magi2/parallel.py``.

The group record and the two group getters the swapped layers call. The stand-in never joins a
process group: both getters return a single rank (upstream returns vLLM's TP or Ulysses group).
The Ulysses and EP all-to-all helpers are left out; the tests exercise expert parallelism on
magi2-core's side (tests/distributed/test_vllm_omni_ep.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class Magi2ParallelGroup:
    group: dist.ProcessGroup | None
    world_size: int
    rank: int
    replicated_sequence: bool = False


def get_magi2_ulysses_group() -> Magi2ParallelGroup:
    return Magi2ParallelGroup(None, 1, 0)


def get_magi2_ep_group() -> Magi2ParallelGroup:
    return Magi2ParallelGroup(None, 1, 0)
