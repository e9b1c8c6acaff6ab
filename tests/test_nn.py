"""The nn.Module wrappers call the public ops with the checkpoint layouts."""

from __future__ import annotations

import torch

import magi2_core as m2
from magi2_core.integrations import vllm_omni as integ
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


def test_layers_route_with_the_parameter_itself_so_no_write_goes_unseen() -> None:
    """The layers hold no derived copy of the router: a write that bypasses the version counter
    (``.data.copy_``, as weight loaders may do) still routes with the new values."""
    torch.manual_seed(0)
    moe = HeadRoutedMoE(num_heads=2, head_dim=16, num_experts=8, intermediate=32, top_k=3, dtype=torch.float32)
    cfg = integ.Magi2MultiHeadMoEConfig(32, 2, 8, 2, 24, torch.float32, route_scale=4.9)
    layer = integ.Magi2MultiHeadMoE(cfg, ep_group=integ.EPGroup())
    for p in layer.parameters():
        with torch.no_grad():
            p.copy_(torch.randn_like(p) * 0.1)
    x = torch.randn(7, 32)
    heads = x.view(7, 2, 16)
    for module, router in ((moe, moe.router), (layer, layer.gate)):
        bias = moe.expert_bias if module is moe else layer._router_bias()
        w = (moe.w_gate, moe.w_up, moe.w_down) if module is moe else (layer.W_gate, layer.W_up, layer.W_down)
        with torch.no_grad():
            before = module(x)
            version = router._version
            router.data.copy_(torch.randn_like(router))  # the version counter does not move
            assert router._version == version
            y = module(x)
            probs, idx = m2.moe_route(heads, router.detach().clone(), bias, top_k=module.top_k, route_scale=4.9)
            assert not torch.equal(y, before)  # the write changes the route, so the check below can fail
            assert torch.equal(y, m2.moe_experts(heads, probs, idx, *w).view(7, 32))
