"""The router weight prepared once at load time: ``prepare_router_weight``, ``PreparedRouterWeight`` in
``moe_route``, and the layers that keep it current (``nn.HeadRoutedMoE``, the vllm-omni layer).

A fake provider that prepares (the BF16x3 planes, like ``triton_fused``) and records what it was
given runs on the CPU: the planes reach it only while they describe the weight, and every call
gives the plain weight's result.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from magi2_backend_reference.moe import reference_moe_route

import magi2_core as m2
from magi2_core.capability import Capability
from magi2_core.errors import InvalidDTypeError, InvalidShapeError, InvalidValueError
from magi2_core.integrations import vllm_omni as integ
from magi2_core.moe_weights import CHECKPOINT, ROUTER_BF16X3, PreparedRouterWeight, split_router_bf16x3
from magi2_core.nn import HeadRoutedMoE
from magi2_core.problem import Feature
from magi2_core.testing import registered_backend

SEEN: list[torch.Tensor | None] = []  # the planes each call of the fake received (None: none)


class PreparingRoute:
    """The reference route, with a preparation step; records whether it got the prepared planes."""

    def prepare_router_weight(self, router_weight: torch.Tensor) -> tuple[str, tuple[torch.Tensor, ...]]:
        return ROUTER_BF16X3, (router_weight, split_router_bf16x3(router_weight))

    def __call__(self, x: torch.Tensor, router_weight: torch.Tensor, bias: torch.Tensor | None, *,
                 prepared: PreparedRouterWeight | None = None, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
        SEEN.append(None if prepared is None else prepared.tensors[1])
        if prepared is not None:  # the planes describe exactly this weight
            assert prepared.weight is router_weight
            assert torch.equal(prepared.tensors[1].double().sum(0), router_weight.double())
        return reference_moe_route(x, router_weight, bias, **kw)  # type: ignore[arg-type]


preparing_route = PreparingRoute()


@pytest.fixture
def preparer() -> Iterator[None]:
    cap = Capability(op="moe_route", name="preparing", impl=f"{__name__}:preparing_route", version="0",
                     device_types=("cpu",), dtypes=("float32", "bfloat16", "float16"),
                     features=frozenset({Feature.COMPILING, Feature.ROUTE_SOFTMAX, Feature.ROUTE_NO_NORM}),
                     priority=100, description="the reference route behind a preparation step")
    SEEN.clear()
    with registered_backend(cap, name="preparing-route"):
        yield


def _inputs(t: int = 9, hl: int = 2, e: int = 8, d: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(t, hl, d, generator=g), torch.randn(hl * e, d, generator=g) / 4,
            torch.randn(hl * e, generator=g) * 0.1)


def _same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_the_split_is_exact_and_a_function_of_the_bits() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 32, generator=g) * torch.exp2(torch.randint(-100, 100, (64, 32), generator=g).float())
    planes = split_router_bf16x3(w)
    assert planes.dtype == torch.bfloat16 and planes.shape == (3, 64, 32)
    assert torch.equal(planes.double().sum(0), w.double())
    top = (w.view(torch.int32) >> 16).to(torch.int16)  # hi is the weight's top 16 bits
    assert torch.equal(planes[0].view(torch.int16), top)


@pytest.mark.usefixtures("preparer")
def test_prepared_planes_are_used_only_while_current() -> None:
    x, w, b = _inputs()
    plain = m2.moe_route(x, w, b, top_k=3)
    assert SEEN == [None]
    prepared = m2.prepare_router_weight(w, num_heads=2, dtype=torch.float32)
    assert (prepared.provider, prepared.layout) == ("preparing", ROUTER_BF16X3) and prepared.current()
    assert prepared.current_for(w) and not prepared.current_for(w.clone())
    assert _same(m2.moe_route(x, prepared, b, top_k=3), plain)
    assert SEEN[-1] is prepared.tensors[1]
    with torch.no_grad():
        w.mul_(2.0)  # an in-place write: the planes are stale
    assert not prepared.current()
    assert _same(m2.moe_route(x, prepared, b, top_k=3), m2.moe_route(x, w, b, top_k=3))
    assert SEEN[-2:] == [None, None]
    # another provider serves a prepared object too (its weight)
    assert _same(m2.moe_route(x, prepared, b, top_k=3, provider="reference"), reference_moe_route(
        x, w, b, top_k=3, route_scale=4.9, route_norm=True, score_func="sigmoid"))


@pytest.mark.usefixtures("preparer")
def test_compiled_calls_rebuild_the_prepared_weight_and_check_it() -> None:
    x, w, b = _inputs()
    prepared = m2.prepare_router_weight(w, num_heads=2, dtype=torch.float32)
    torch._dynamo.reset()
    fn = torch.compile(lambda t: m2.moe_route(t, prepared, b, top_k=3), fullgraph=True, backend="aot_eager")
    assert _same(fn(x), m2.moe_route(x, w, b, top_k=3))
    assert any(p is not None and torch.equal(p, prepared.tensors[1]) for p in SEEN)
    SEEN.clear()
    with torch.no_grad():
        w.add_(0.5)
    assert _same(fn(x), m2.moe_route(x, w, b, top_k=3))
    assert SEEN[0] is None  # inside the graph too: stale planes are not used


def test_a_provider_without_preparation_keeps_the_weight() -> None:
    x, w, b = _inputs()
    prepared = m2.prepare_router_weight(w, num_heads=2, dtype=torch.float32)
    assert prepared.provider == "reference" and prepared.layout == CHECKPOINT and len(prepared.tensors) == 1
    assert prepared.weight.data_ptr() == w.data_ptr()
    assert _same(m2.moe_route(x, prepared, b, top_k=3), m2.moe_route(x, w, b, top_k=3))


def test_preparation_checks_its_arguments() -> None:
    _, w, _ = _inputs()
    with pytest.raises(InvalidShapeError, match="router_weight"):
        m2.prepare_router_weight(w, num_heads=3)
    with pytest.raises(InvalidDTypeError, match="router_weight"):
        m2.prepare_router_weight(w.bfloat16(), num_heads=2)
    with pytest.raises(InvalidValueError, match="num_heads"):
        m2.prepare_router_weight(w, num_heads=0)
    with pytest.raises(InvalidValueError, match="dtype"):
        m2.prepare_router_weight(w, num_heads=2, dtype=torch.int8)
    with pytest.raises(InvalidShapeError, match="planes"):
        PreparedRouterWeight.from_layout("x", ROUTER_BF16X3, (w, split_router_bf16x3(w)[:2]))
    with pytest.raises(InvalidValueError, match="layout"):
        PreparedRouterWeight.from_layout("x", "w13_interleaved", (w,))


@pytest.mark.usefixtures("preparer")
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
    for module, router in ((moe, moe.router), (layer, layer.gate)):
        with torch.no_grad():
            module(x)
            assert SEEN[-1] is None  # the plain weight reached the provider
            router.data.copy_(torch.randn_like(router))  # the version counter does not move
            y = module(x)
            heads = x.view(7, 2, 16)
            bias = moe.expert_bias if module is moe else layer._router_bias()
            probs, idx = m2.moe_route(heads, router.detach(), bias, top_k=module.top_k, route_scale=4.9,
                                      provider="reference")
            w = (moe.w_gate, moe.w_up, moe.w_down) if module is moe else (layer.W_gate, layer.W_up, layer.W_down)
            assert torch.equal(y, m2.moe_experts(heads, probs, idx, *w).view(7, 32))
