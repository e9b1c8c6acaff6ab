"""vllm-omni's MoE layer stack on magi2-core: the integration layer vs the bare operator calls.

L layers of :class:`magi2_core.integrations.vllm_omni.Magi2MultiHeadMoE` with distinct weights
(production-local shape: 3 heads x 256 experts, top-6, d 256, I 1280, BF16; FP32 router and biases),
weights prepared once at load (the layer lays them out when built and loaded), run one after the
other on the same tokens:

- ``layer``: ``layer(x)`` for every layer, what vllm-omni calls (view, bias pick, route, experts);
- ``ops``: ``m2.moe_route`` + ``m2.moe_experts`` on the same prepared weights: a block's MoE share.

Both are timed eager and as one CUDA graph of the whole stack (per layer = stack time / L). As in
``benchmarks/block.py``'s ``ops_alone``, layer 0's routing and experts are also timed alone, each
in its own CUDA graph, and so is layer 0's ``layer(x)``: the acceptance compares the layer with that
route + experts sum (within 5%). Timing, L2 flush and statistics: ``benchmarks/_common``.
Correctness: every layer's output equals the bare calls' output bit for bit.

    python -m benchmarks.vllm_omni_moe --out benchmarks/results/vllm_omni_moe_h200.json
    python -m benchmarks.vllm_omni_moe --dry-run --out /tmp/vllm_omni_moe_dry.json   # CPU, tiny shapes
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import torch

import magi2_core as m2
from benchmarks._common import env_record, graphed, stats, time_alternating
from magi2_core.integrations.vllm_omni import EPGroup, Magi2MultiHeadMoE, Magi2MultiHeadMoEConfig

Fn = Callable[[], Any]
HL, E, K, D, INTER = 3, 256, 6, 256, 1280
ROUTE_SCALE = 4.9
TARGET = 1.05  # the layer within 5% of the bare route + experts


def build_stack(layers: int, dev: str, seed: int = 14) -> list[Magi2MultiHeadMoE]:
    """L layers with distinct random weights, loaded as a checkpoint is (in place, then prepared)."""
    g = torch.Generator(device=dev).manual_seed(seed)
    cfg = Magi2MultiHeadMoEConfig(HL * D, HL, E, K, INTER, torch.bfloat16, route_scale=ROUTE_SCALE)
    stack = []
    for _ in range(layers):
        layer = Magi2MultiHeadMoE(cfg, ep_group=EPGroup(), device=dev)
        with torch.no_grad():
            layer.gate.copy_(torch.randn(layer.gate.shape, device=dev, generator=g) / D**0.5)
            for w, fan_in in ((layer.W_gate, D), (layer.W_up, D), (layer.W_down, INTER)):
                w.copy_(torch.randn(w.shape, device=dev, generator=g) / fan_in**0.5)
            for b in (layer.router.expert_bias, layer.router.expert_bias_ema):
                b.copy_(torch.randn(b.shape, device=dev, generator=g) * 0.01)
        stack.append(layer)
    return stack


def route(layer: Magi2MultiHeadMoE, heads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return m2.moe_route(heads, layer.gate, layer.router.expert_bias_ema, top_k=K, route_scale=ROUTE_SCALE)


def ops_call(layer: Magi2MultiHeadMoE, x: torch.Tensor) -> torch.Tensor:
    """The bare operators on the layer's prepared weights (what a block's MoE share runs)."""
    heads = x.view(-1, HL, D)
    probs, idx = route(layer, heads)
    return m2.moe_experts(heads, probs, idx, layer.prepared_weights()).view(-1, HL * D)


def bench(stack: list[Magi2MultiHeadMoE], tokens: int, iters: int, dev: str) -> dict[str, Any]:
    x = torch.randn(tokens, HL * D, device=dev).bfloat16()
    heads = x.view(-1, HL, D)
    first = stack[0]
    with torch.no_grad():
        for i, layer in enumerate(stack):
            a, b = layer(x), ops_call(layer, x)
            if not torch.equal(a, b):
                raise AssertionError(f"T={tokens} layer {i}: layer != bare ops, max |diff| {(a - b).abs().max()}")
        probs, idx = route(first, heads)

        def run_layers() -> None:
            for layer in stack:
                layer(x)

        def run_ops() -> None:
            for layer in stack:
                ops_call(layer, x)

        stack_fns: dict[str, Fn] = {"layer_eager": run_layers, "ops_eager": run_ops}
        alone: dict[str, Fn] = {
            "layer": lambda: first(x),
            "moe_route": lambda: route(first, heads),
            "moe_experts": lambda: m2.moe_experts(heads, probs, idx, first.prepared_weights()),
        }
        if dev != "cpu":
            stack_fns |= {"layer_graph": graphed(run_layers, dev), "ops_graph": graphed(run_ops, dev)}
            alone = {k: graphed(f, dev) for k, f in alone.items()}
        stack_times = time_alternating(stack_fns, iters, device=dev)
        alone_times = time_alternating(alone, iters, device=dev)
    per_layer = {k: stats([v / len(stack) for v in s]) for k, s in stack_times.items()}
    single = {k: stats(s) for k, s in alone_times.items()}
    share = single["moe_route"]["p50"] + single["moe_experts"]["p50"]
    ratios = {
        f"layer_over_ops_{m}": per_layer[f"layer_{m}"]["p50"] / per_layer[f"ops_{m}"]["p50"]
        for m in ("eager", "graph")
        if f"ops_{m}" in per_layer
    }
    ratios["layer_alone_over_route_plus_experts"] = single["layer"]["p50"] / share
    if "layer_graph" in per_layer:
        ratios["stack_graph_per_layer_over_route_plus_experts"] = per_layer["layer_graph"]["p50"] / share
    return {
        "tokens": tokens,
        "layers": len(stack),
        "stack_ms_per_layer": per_layer,
        "layer0_alone_ms": single,
        "moe_share_ms": share,
        "ratios": ratios,
        "within_target": all(v <= TARGET for v in ratios.values()),
        "providers": {
            "moe_route": m2.resolve("moe_route", heads, first.gate, first.router.expert_bias_ema, top_k=K).chosen,
            "moe_experts": m2.resolve("moe_experts", heads, probs, idx, first.prepared_weights()).chosen,
        },
    }


def main() -> None:
    global HL, E, K, D, INTER
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, nargs="*", default=[14601, 4096])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (checks the script only)")
    a = p.parse_args()
    if a.layers < 4 and not a.dry_run:
        p.error("--layers must be >= 4 (distinct weights must not fit in the L2)")
    dev = "cpu" if a.dry_run else "cuda"
    if a.dry_run:
        HL, E, K, D, INTER = 3, 8, 2, 16, 24
        a.tokens, a.iters = [40, 17], 3
    stack = build_stack(a.layers, dev)
    weights = stack[0].prepared_weights()
    report: dict[str, Any] = {
        **env_record(dev),
        "magi2_core": m2.__version__,
        "shape": {"local_heads": HL, "experts": E, "top_k": K, "d": D, "I": INTER, "dtype": "bfloat16"},
        "prepared": {"provider": weights.provider, "layout": weights.layout, "nbytes_per_layer": weights.nbytes},
        "method": "CUDA events, L2 flushed before each call, variants rotate (benchmarks/_common); "
        "stack per layer = stack time / L; layer0_alone: each in its own CUDA graph, as block.py's ops_alone",
        "target": f"layer <= {TARGET} x (moe_route + moe_experts)",
        "results": [],
    }
    for t in a.tokens:
        report["results"].append(bench(stack, t, a.iters, dev))
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
        r = report["results"][-1]
        per = ", ".join(f"{k} {v['p50']:.3f}" for k, v in r["stack_ms_per_layer"].items())
        print(
            f"T={t} L={a.layers} ms/layer: {per}; route+experts alone {r['moe_share_ms']:.3f}; "
            f"ratios {json.dumps(r['ratios'])}; within 5%: {r['within_target']}; {r['providers']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
