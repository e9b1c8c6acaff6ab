"""Fused head-routed BF16 MoE (operators.md §3)."""

from .fused import MoEState, fused_moe_experts

__all__ = ["MoEState", "fused_moe_experts"]
