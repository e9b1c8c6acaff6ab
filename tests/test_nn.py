"""The nn.Module wrappers call the public ops with the checkpoint layouts."""

from __future__ import annotations

import torch

import magi2_core as m2
from magi2_core.nn import HeadRoutedMoE, MultiModalityRMSNorm, PackedAttentionWithSinks


def test_rmsnorm_module_matches_function_and_tracks_weight_updates() -> None:
    norm = MultiModalityRMSNorm(16, num_modality=3, out_dtype=torch.float32)
    x = torch.randn(9, 16)
    sizes = [4, 0, 5]
    with torch.no_grad():  # the ops are forward-only; a Parameter requires grad
        assert torch.equal(norm(x, sizes), m2.rmsnorm(x, torch.zeros(3, 1, 16), modality_sizes=sizes))
        norm.weight.add_(torch.randn(48))
        assert torch.equal(norm(x, sizes), m2.rmsnorm(x, norm.weight.view(3, 1, 16), modality_sizes=sizes))
    assert list(norm.state_dict()) == ["weight"]


def test_attention_module_uses_its_fp32_sinks() -> None:
    attn = PackedAttentionWithSinks(num_heads=4, sink_tokens=2)
    with torch.no_grad():
        attn.sinks.copy_(torch.randn(2, 4))
    q, k, v = torch.randn(10, 4, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)
    cu_q, cu_k = torch.tensor([0, 3, 10]), torch.tensor([0, 5, 12])
    expected = m2.attention(q, k, v, cu_q, cu_k, sinks=attn.sinks.detach())
    with torch.inference_mode():
        assert torch.equal(attn(q, k, v, cu_q, cu_k), expected)
    assert attn.sinks.dtype == torch.float32


def test_moe_module_routes_each_head_over_its_own_experts() -> None:
    torch.manual_seed(0)
    moe = HeadRoutedMoE(num_heads=2, head_dim=8, num_experts=4, intermediate=16, top_k=2, dtype=torch.float32)
    x = torch.randn(5, 16)
    heads = x.view(5, 2, 8)
    probs, idx = m2.moe_route(heads, moe.router.detach(), moe.expert_bias, top_k=2)
    expected = m2.moe_experts(heads, probs, idx, moe.w_gate.detach(), moe.w_up.detach(), moe.w_down.detach())
    with torch.no_grad():
        assert torch.equal(moe(x), expected.reshape(5, 16))
