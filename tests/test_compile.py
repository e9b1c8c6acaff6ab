"""torch.compile(fullgraph=True) over the public ops: opaque custom ops, resolution outside the graph."""

from __future__ import annotations

import pytest
import torch

import magi2_core as m2


def _inputs() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(
        x=r(7, 2, 16),
        w=r(1, 1, 16) * 0.1,
        q=r(9, 4, 16),
        k=r(9, 2, 16),
        v=r(9, 2, 16),
        sinks=r(1, 4),
        router=r(8, 16),
        bias=r(8) * 0.01,
        wg=r(8, 16, 32) / 4,
        wu=r(8, 16, 32) / 4,
        wd=r(8, 32, 16) / 4,
    )


def _block(t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    h = m2.rmsnorm(t["x"], t["w"], out_dtype=torch.float32)
    o, lse = m2.attention(
        t["q"], t["k"], t["v"], cu, cu, max_seqlen_q=5, max_seqlen_k=5, sinks=t["sinks"], return_lse=True
    )
    p, i = m2.moe_route(h, t["router"], t["bias"], top_k=2)
    y = m2.moe_experts(h, p, i, t["wg"], t["wu"], t["wd"])
    return h, o, lse, p, i, y


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_fullgraph_compile_matches_eager(backend: str) -> None:
    torch._dynamo.reset()
    t = _inputs()
    eager = _block(t)
    compiled = torch.compile(_block, fullgraph=True, backend=backend)(t)
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a, b)


def test_graph_holds_one_opaque_node_per_op() -> None:
    torch._dynamo.reset()
    seen: list[str] = []

    def capture(gm: torch.fx.GraphModule, _inputs: object) -> object:
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch.compile(_block, fullgraph=True, backend=capture)(_inputs())
    assert [s.removesuffix(".default") for s in seen if s.startswith("magi2.")] == [
        "magi2.rmsnorm",
        "magi2.attention",
        "magi2.moe_route",
        "magi2.moe_experts",
    ]
