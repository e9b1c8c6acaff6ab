"""Route alignment of the fused MoE: atomic kernels vs the stable kernels vs the torch stable statement.

Deterministic mode needs every route's slot fixed (each expert's routes in route order). Before the
stable kernels it ran the torch statement (`align.align_routes_stable`: a sort and a dozen small
ops). This benchmark times, at the production-local shapes, each alignment alone, and the whole
fused call in default and deterministic mode, all replayed from CUDA graphs with the L2 flushed;
p50 and p10-p90. It also checks that the stable kernels give the torch statement's buffers bit for
bit and that the deterministic call repeats bit for bit.

    PYTHONPATH=backends/triton/src:backends/reference/src:. python -m benchmarks.moe_align --out moe_align.json
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from typing import Any

import torch
from magi2_backend_triton.moe.align import (
    RouteBuffers,
    align_routes_device,
    align_routes_device_stable,
    align_routes_stable,
    flat_route_experts,
    route_capacity,
)
from magi2_backend_triton.moe.fused import MoEState, call_problem, run_fused
from magi2_backend_triton.moe.pack import pack_w13
from magi2_backend_triton.providers import triton_moe_experts

from benchmarks import _common
from benchmarks import moe as bm

SHAPES = [(512, 3), (4096, 3), (14601, 3), (4096, 12)]


def one_shape(tokens: int, heads: int, iters: int) -> dict[str, Any]:
    x, probs, idx, wg, wu, wd = bm.make_inputs(tokens, heads)
    num_experts = heads * bm.E
    rid = flat_route_experts(idx, bm.E)
    # the plan of each mode (the per-expert kernel's route lists are not an alignment: its
    # aligned twin with the same tile serves deterministic mode, as the plan rows say)
    plan = triton_moe_experts.plan(call_problem(x, idx, wg, False))
    det_plan = triton_moe_experts.plan(call_problem(x, idx, wg, True))
    block_m = det_plan.tile["BLOCK_M"]
    capacity = route_capacity(rid.numel(), num_experts, block_m)
    bufs = {n: RouteBuffers.allocate(capacity, block_m, num_experts, x.device) for n in ("atomic", "kernels", "torch")}
    aligns: dict[str, Callable[[], Any]] = {
        "atomic": functools.partial(align_routes_device, idx, bm.E, bufs["atomic"]),
        "stable_kernels": functools.partial(align_routes_device_stable, idx, bm.E, bufs["kernels"]),
        "stable_torch": functools.partial(align_routes_stable, rid, num_experts, bufs["torch"]),
    }
    for fn in aligns.values():
        fn()
    padded = int(bufs["torch"].num_padded.item())
    got, want = bufs["kernels"], bufs["torch"]
    equal = (
        int(got.num_padded.item()) == padded
        and torch.equal(got.sorted_ids[:padded], want.sorted_ids[:padded])
        and torch.equal(got.expert_ids[: padded // block_m], want.expert_ids[: padded // block_m])
    )
    bank = pack_w13(wg, wu)
    gate, up = bank[:, 0::2, :].transpose(1, 2), bank[:, 1::2, :].transpose(1, 2)
    del wg, wu
    calls: dict[str, Callable[[], Any]] = {
        "op_default": functools.partial(run_fused, x, probs, idx, gate, up, wd, state=MoEState(), plan=plan),
        "op_deterministic": functools.partial(
            run_fused, x, probs, idx, gate, up, wd, state=MoEState(), plan=det_plan, deterministic=True
        ),
    }
    y1, y2 = calls["op_deterministic"]().y, calls["op_deterministic"]().y
    y0 = calls["op_default"]().y
    graphs = {name: _common.graphed(fn) for name, fn in {**aligns, **calls}.items()}
    samples = _common.time_alternating(graphs, iters)
    return {
        "tokens": tokens,
        "heads": heads,
        "routes": rid.numel(),
        "experts": num_experts,
        "block_m": block_m,
        "chunk": got.chunk,
        "tiles_variant": plan.variant,
        "stable_kernels_equal_torch": bool(equal),
        "deterministic_repeats_bitwise": bool(torch.equal(y1, y2)),
        "deterministic_max_abs_vs_default": float((y1.float() - y0.float()).abs().max()),
        "graph_ms": {name: _common.stats(s) for name, s in samples.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/moe_align_h200.json")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    report: dict[str, Any] = {
        "benchmark": "moe_align",
        **_common.env_record(),
        "method": "each alignment alone and the whole fused call, CUDA graph replays, L2 flushed, rotating",
        "shapes": [],
    }
    for tokens, heads in SHAPES:
        rec = one_shape(tokens, heads, args.iters)
        report["shapes"].append(rec)
        g = rec["graph_ms"]
        print(
            f"T={tokens:6d} Hl={heads:2d} chunk {rec['chunk']}: align atomic {g['atomic']['p50']:.4f} "
            f"stable_kernels {g['stable_kernels']['p50']:.4f} stable_torch {g['stable_torch']['p50']:.4f} ms; "
            f"op default {g['op_default']['p50']:.3f} deterministic {g['op_deterministic']['p50']:.3f} ms; "
            f"equal {rec['stable_kernels_equal_torch']} repeat {rec['deterministic_repeats_bitwise']}",
            flush=True,
        )
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
