"""Raw vs prepared expert weights through the public op: what reading raw gate/up in place costs.

    python -m benchmarks.moe_raw --out benchmarks/results/moe_raw_<device>.json       # GPU, production shape
    TRITON_INTERPRET=1 python -m benchmarks.moe_raw --smoke --out /tmp/moe_raw.json    # plumbing, CPU, tiny

Shape (production-local): 3 heads x 256 experts, d = 256, I = 1280, top-6, BF16; T = 512, 4096, 14601
(``--tokens`` changes the list). Per T, through ``m2.moe_experts`` (the provider it resolves to):

* ``prepared``: weights laid out once by ``m2.prepare_moe_weights`` (the Triton provider's packed
  gate/up bank, read in place by the plan's kernel);
* ``raw``: the checkpoint tensors as loaded. Nothing is cached for them: the plan's raw-weights step
  (the `one_kernel` variant, same tile) reads gate/up in place, so a write between calls is always seen;
* ``raw_repacked``: ``prepare_moe_weights`` then the prepared call, every call: what packing raw
  weights afresh per call (the other sound design) would cost.

Each is timed eager (and ``prepared`` / ``raw`` as CUDA-graph replays on a GPU), calls alternating with
the L2 flushed before each (``benchmarks/_common``); p50 with p10/p90 in ms, and ``raw / prepared``.
Every T also records the plans that ran, whether raw and prepared outputs are bit-equal, and a
freshness check: raw weights rewritten through ``.data.copy_`` after a call, the next call against the
exact reference (``accept_moe_experts``). ``--smoke`` runs a tiny shape on the CPU through the Triton
interpreter, one timed round, to check the script before a GPU run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from magi2_backend_reference.moe import exact_moe_experts
from magi2_backend_triton.moe.fused import run_fused
from torch import Tensor

import magi2_core as m2
from benchmarks._common import env_record, graphed, measure, pack_counter
from magi2_core.contracts.acceptance import accept_moe_experts


@dataclass(frozen=True)
class Shape:
    """One benchmark configuration: local heads, experts per head, top-k, hidden, intermediate."""

    heads: int
    experts: int
    top_k: int
    hidden: int
    intermediate: int


PRODUCTION = Shape(heads=3, experts=256, top_k=6, hidden=256, intermediate=1280)
SMOKE = Shape(heads=2, experts=4, top_k=2, hidden=32, intermediate=32)
TOKENS = (512, 4096, 14601)
SMOKE_TOKENS = (9,)


def make_inputs(shape: Shape, tokens: int, device: str, seed: int = 43) -> tuple[Tensor, ...]:
    """x, probs, idx (distinct experts per token, route_scale-sized weights) and checkpoint-layout weights."""
    g = torch.Generator(device=device).manual_seed(seed)
    h, e, k, d, i = shape.heads, shape.experts, shape.top_k, shape.hidden, shape.intermediate
    x = torch.randn(tokens, h, d, device=device, generator=g).bfloat16()
    w_gate, w_up = ((torch.randn(h * e, d, i, device=device, generator=g) / math.sqrt(d)).bfloat16() for _ in "gu")
    w_down = (torch.randn(h * e, i, d, device=device, generator=g) / math.sqrt(i)).bfloat16()
    top, idx = torch.randn(h, tokens, e, device=device, generator=g).topk(k, dim=-1)
    probs = torch.softmax(top, dim=-1) * 4.9
    return x, probs, idx, w_gate, w_up, w_down


def _plan_of(x: Tensor, probs: Tensor, idx: Tensor, weights: Sequence[Tensor]) -> str | None:
    """The plan the Triton launcher runs for these weights (None where another provider serves)."""
    if m2.resolve("moe_experts", x, probs, idx, *weights).chosen != "triton":
        return None
    plan = run_fused(x, probs, idx, *weights).plan
    return None if plan is None else plan.describe()


def freshness(shape: Shape, tokens: int, device: str) -> dict[str, Any]:
    """Raw weights rewritten through ``.data.copy_`` after a call: is the next call the new weights' answer?"""
    x, probs, idx, wg, wu, wd = make_inputs(shape, tokens, device)
    *_, ng, nu, nd = make_inputs(shape, tokens, device, seed=44)
    m2.moe_experts(x, probs, idx, wg, wu, wd)
    for w, new in ((wg, ng), (wu, nu), (wd, nd)):
        w.data.copy_(new)  # what a weight loader or an RL refit does; autograd's version counter stays
    got = m2.moe_experts(x, probs, idx, wg, wu, wd)
    verdict = accept_moe_experts(got, exact_moe_experts(x, probs, idx, ng, nu, nd), shape.intermediate)
    return {"ok": bool(verdict), "verdict": str(verdict)}


def point(shape: Shape, tokens: int, device: str, iters: int) -> dict[str, Any]:
    """Every form at ``tokens``: times, plans, bit-equality, packs per call and the freshness check."""
    x, probs, idx, wg, wu, wd = make_inputs(shape, tokens, device)
    prepared = m2.prepare_moe_weights(wg, wu, wd)
    fns: dict[str, Callable[[], object]] = {
        "prepared": lambda: m2.moe_experts(x, probs, idx, prepared),
        "raw": lambda: m2.moe_experts(x, probs, idx, wg, wu, wd),
        "raw_repacked": lambda: m2.moe_experts(x, probs, idx, m2.prepare_moe_weights(wg, wu, wd)),
    }
    if device != "cpu":
        fns["prepared_graph"] = graphed(fns["prepared"], device)
        fns["raw_graph"] = graphed(fns["raw"], device)
    same = torch.equal(fns["prepared"](), fns["raw"]())  # type: ignore[arg-type]
    pack_count = pack_counter()
    assert pack_count is not None
    packs = pack_count()
    fns["raw"]()
    raw_packs = pack_count() - packs
    times = measure(fns, iters, device=device, label=f"T{tokens}")
    p50 = {name: t["p50"] for name, t in times.items()}
    return {
        "tokens": tokens,
        "provider": m2.resolve("moe_experts", x, probs, idx, prepared).chosen,
        "plans": {
            "prepared": _plan_of(x, probs, idx, (prepared.w_gate, prepared.w_up, prepared.w_down)),
            "raw": _plan_of(x, probs, idx, (wg, wu, wd)),
        },
        "ms": times,
        "raw_over_prepared": p50["raw"] / p50["prepared"],
        "raw_repacked_over_prepared": p50["raw_repacked"] / p50["prepared"],
        "graph_raw_over_prepared": p50["raw_graph"] / p50["prepared_graph"] if "raw_graph" in p50 else None,
        "raw_equals_prepared_bitwise": same,
        "packs_per_raw_call": raw_packs,
        "fresh_after_data_copy": freshness(shape, tokens, device),
    }


def run(shape: Shape, tokens: Sequence[int], device: str, iters: int, smoke: bool) -> dict[str, Any]:
    rows, errors = [], []
    for t in tokens:
        try:
            rows.append(point(shape, t, device, iters))
        except Exception as exc:  # one shape that fails must not lose the others; the file says what failed
            errors.append(f"T={t}: {type(exc).__name__}: {exc}")
    return {
        **env_record(device),
        "smoke": smoke,
        "shape": asdict(shape),
        "iters": iters,
        "rows": rows,
        "errors": errors,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", required=True, help="the JSON result file")
    p.add_argument("--tokens", type=int, nargs="*", help=f"token counts (default {TOKENS}; smoke {SMOKE_TOKENS})")
    p.add_argument("--iters", type=int, default=30, help="timed rounds per form (smoke: 1)")
    p.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU through the Triton interpreter")
    args = p.parse_args(argv)
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--smoke runs the Triton kernels through the interpreter: set TRITON_INTERPRET=1")
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("the benchmark times a CUDA GPU; --smoke checks the script on the CPU")
    shape, device = (SMOKE, "cpu") if args.smoke else (PRODUCTION, "cuda")
    tokens = args.tokens or (SMOKE_TOKENS if args.smoke else TOKENS)
    report = run(shape, tokens, device, 1 if args.smoke else args.iters, args.smoke)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    for row in report["rows"]:
        ms = row["ms"]
        print(
            f"T={row['tokens']}: prepared {ms['prepared']['p50']:.3f} ms, raw {ms['raw']['p50']:.3f} ms "
            f"(x{row['raw_over_prepared']:.2f}), re-packed per call {ms['raw_repacked']['p50']:.3f} ms; "
            f"fresh after .data.copy_: {row['fresh_after_data_copy']['ok']}"
        )
    for err in report["errors"]:
        print("error:", err)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
