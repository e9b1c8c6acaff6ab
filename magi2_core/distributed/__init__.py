"""Scale-out layers over ``torch.distributed``: expert-parallel MoE and Ulysses attention.

Thin wrappers: ``torch.distributed.all_to_all_single`` moves the data (NCCL on GPUs, gloo on CPU)
and the resolved single-device operators compute. Without an initialised process group every layer
is a plain single-device call.
"""

from magi2_core.distributed._a2a import ShardPlan, exchange_token_counts, group_rank_world
from magi2_core.distributed.ep_moe import ep_head_counts, ep_local_heads, ep_moe, ep_moe_local, ep_plan, ep_slice
from magi2_core.distributed.ulysses import UlyssesPlans, ulysses_attention, ulysses_plans

__all__ = [
    "ShardPlan",
    "UlyssesPlans",
    "ep_head_counts",
    "ep_local_heads",
    "ep_moe",
    "ep_moe_local",
    "ep_plan",
    "ep_slice",
    "exchange_token_counts",
    "group_rank_world",
    "ulysses_attention",
    "ulysses_plans",
]
