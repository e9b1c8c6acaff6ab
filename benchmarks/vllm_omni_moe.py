"""vllm-omni's MoE layer stack on magi2-core: the integration layer vs the bare operator calls.

L layers of :class:`magi2_core.integrations.vllm_omni.Magi2MultiHeadMoE` with distinct weights
(production-local shape: 3 heads x 256 experts, top-6, d 256, I 1280, BF16; FP32 router and biases),
weights prepared once at load (``prepare_weights``), run one after the other on the same tokens:

- ``layer``: ``layer(x)`` for every layer, what vllm-omni calls (view, bias pick, route, experts);
- ``ops``: ``m2.moe_route`` + ``m2.moe_experts`` on the same prepared weights, the MoE share of a
  block (route + experts), the baseline the layer must match within 5%.

Each is timed eager and as one CUDA graph of the whole stack. Times are per layer (stack time / L),
device events, variants alternating, a 512 MiB buffer zeroed before every stack call (outside the
timed region; the weights, 1.5 GB per layer, never fit in L2 anyway). Correctness: the layer's
output must equal the bare calls' output bit for bit.

    python -m benchmarks.vllm_omni_moe --out benchmarks/results/vllm_omni_moe_h200.json
    python -m benchmarks.vllm_omni_moe --dry-run --out /tmp/vllm_omni_moe_dry.json   # CPU, tiny shapes
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch

import magi2_core as m2
from magi2_core.integrations.vllm_omni import EPGroup, Magi2MultiHeadMoE, Magi2MultiHeadMoEConfig

HL, E, K, D, INTER = 3, 256, 6, 256, 1280
ROUTE_SCALE = 4.9


def build_stack(layers: int, dev: str, seed: int = 14) -> list[Magi2MultiHeadMoE]:
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
        layer.prepare_weights()
        stack.append(layer)
    return stack


def ops_call(layer: Magi2MultiHeadMoE, x: torch.Tensor) -> torch.Tensor:
    """The bare operators on the layer's prepared weights (what a block's MoE share runs)."""
    heads = x.view(-1, HL, D)
    probs, idx = m2.moe_route(heads, layer.gate, layer.router.expert_bias_ema, top_k=K, route_scale=ROUTE_SCALE)
    return m2.moe_experts(heads, probs, idx, layer.prepare_weights()).view(-1, HL * D)


def time_alternating(fns: dict[str, Callable[[], Any]], iters: int, cuda: bool) -> dict[str, list[float]]:
    flush = torch.empty(512 * 2**20 if cuda else 1024, dtype=torch.uint8, device="cuda" if cuda else "cpu")
    for fn in fns.values():
        for _ in range(3):
            fn()
    out: dict[str, list[float]] = {n: [] for n in fns}
    names = list(fns)
    for i in range(iters):
        for n in names if i % 2 == 0 else reversed(names):
            flush.zero_()
            if not cuda:
                t0 = time.perf_counter()
                fns[n]()
                out[n].append((time.perf_counter() - t0) * 1e3)
                continue
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[n]()
            end.record()
            torch.cuda.synchronize()
            out[n].append(start.elapsed_time(end))
    return out


def stats(samples: list[float], per: int) -> dict[str, float]:
    s = sorted(v / per for v in samples)
    q = statistics.quantiles(s, n=10) if len(s) >= 2 else [s[0]] * 9
    return {"p50": statistics.median(s), "p10": q[0], "p90": q[-1], "min": s[0], "n": len(s)}


def graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()  # warm up on a side stream: kernels compiled, caches and buffers allocated
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def bench(stack: list[Magi2MultiHeadMoE], tokens: int, iters: int, dev: str) -> dict[str, Any]:
    cuda = dev == "cuda"
    x = torch.randn(tokens, HL * D, device=dev).bfloat16()
    with torch.no_grad():
        for layer in stack:
            a, b = layer(x), ops_call(layer, x)
            if not torch.equal(a, b):
                raise AssertionError(f"T={tokens}: layer output != bare ops output, max |diff| {(a - b).abs().max()}")

        def run_layers() -> None:
            for layer in stack:
                layer(x)

        def run_ops() -> None:
            for layer in stack:
                ops_call(layer, x)

        fns: dict[str, Callable[[], Any]] = {"layer_eager": run_layers, "ops_eager": run_ops}
        if cuda:
            fns["layer_graph"], fns["ops_graph"] = graphed(run_layers), graphed(run_ops)
        times = time_alternating(fns, iters, cuda)
    res: dict[str, Any] = {"tokens": tokens, "layers": len(stack), "ms_per_layer": {}}
    for name, samples in times.items():
        res["ms_per_layer"][name] = stats(samples, len(stack))
    per = res["ms_per_layer"]
    res["layer_over_ops_p50"] = {
        mode: per[f"layer_{mode}"]["p50"] / per[f"ops_{mode}"]["p50"] for mode in ("eager", "graph") if f"ops_{mode}" in per
    }
    heads = x.view(-1, HL, D)
    probs, idx = m2.moe_route(heads, stack[0].gate, stack[0].router.expert_bias_ema, top_k=K, route_scale=ROUTE_SCALE)
    res["providers"] = {
        "moe_route": m2.resolve("moe_route", heads, stack[0].gate, stack[0].router.expert_bias_ema, top_k=K).chosen,
        "moe_experts": m2.resolve("moe_experts", heads, probs, idx, stack[0].prepare_weights()).chosen,
    }
    return res


def _git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    global HL, E, K, D, INTER
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, nargs="*", default=[14601, 4096])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (checks the script only)")
    a = p.parse_args()
    dev = "cpu" if a.dry_run else "cuda"
    if a.dry_run:
        HL, E, K, D, INTER = 3, 8, 2, 16, 24
        a.tokens, a.iters = [40, 17], 3
    if a.layers < 1:
        p.error("--layers must be >= 1")
    stack = build_stack(a.layers, dev)
    cuda = dev == "cuda"
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "triton": _triton_version(),
        "magi2_core": m2.__version__,
        "commit": os.environ.get("GIT_COMMIT") or _git_commit(),
        "shape": {"local_heads": HL, "experts": E, "top_k": K, "d": D, "I": INTER, "dtype": "bfloat16"},
        "method": "per layer = stack time / L; device events; variants alternate; 512 MiB zeroed before each call",
        "results": [],
    }
    for t in a.tokens:
        report["results"].append(bench(stack, t, a.iters, dev))
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
        r = report["results"][-1]
        line = ", ".join(f"{k} {v['p50']:.3f} ms ({v['p10']:.3f}-{v['p90']:.3f})" for k, v in r["ms_per_layer"].items())
        print(f"T={t} L={a.layers}: {line}; layer/ops p50 {r['layer_over_ops_p50']}; {r['providers']}", flush=True)


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


if __name__ == "__main__":
    main()
