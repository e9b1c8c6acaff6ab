"""Fused head-routed BF16 MoE (operators.md §3) and the torch-native baseline."""

from .fused import MoEState, fused_moe_experts, triton_fused_moe
from .native import grouped_mm_moe_experts

__all__ = ["MoEState", "fused_moe_experts", "grouped_mm_moe_experts", "triton_fused_moe"]
