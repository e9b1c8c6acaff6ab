"""Routing on the GPU in one run: the fused router, the current provider, vllm-omni's route and torch,
with the float64-truth check and the fused experts at the same shapes (so the share is same-run).

    python -m benchmarks.route_profile --out benchmarks/results/route_fused_h200.json
    TRITON_INTERPRET=1 python -m benchmarks.route_profile --dry-run --out /tmp/route.json   # plumbing, CPU

Shapes (production-local): x [T, Hl, 256] BF16, router FP32 [Hl·256, 256] (~N(0, 1/256)), bias FP32
[Hl·256] (~N(0, 0.01^2)), top-6, route_scale 4.9; T = 512, 4096, 14601 at Hl = 3 and T = 4096 at
Hl = 12. Every variant is captured in its own CUDA graph and replayed with the L2 flushed, calls
alternating (benchmarks/_common); p50 with p10/p90:

* ``fused[<config>]``: the fused kernel, every candidate config
  (``magi2_backend_triton.moe_route_fused.CANDIDATES``), splitting the FP32 router in registers as
  shipped; ``fused``: the public op (provider ``triton_fused``, the default config). (The variants that
  read prepared planes or left the selection out are gone: docs/moe-notes.md, "the fused router".)
* ``triton``: the current provider (torch FP32 GEMM + the selection kernel); ``torch``: the
  reference provider (torch FP32 GEMM, sigmoid, stable sort, gather, L1 norm); ``gemm_fp32``: the
  FP32 router GEMM alone;
* ``vllm_omni_main``: vllm-omni's route as main has it (vllm-project/vllm-omni#7175): ``x.float()``,
  the FP32 einsum, then one Triton kernel for sigmoid, bias, top-k (a max and a min-index reduction
  per step), gather and L1 normalisation, then ``* route_scale``; rebuilt here in our own code.
  ``vllm_omni_0.30``: the released torch path (``compute_topk_probs_and_indices``: sigmoid, bias,
  ``torch.topk``, gather, ``F.normalize(p=1)``), also rebuilt here;
* ``experts``: ``m2.moe_experts`` on prepared weights (I = 1280, the tile table's kernel), routed by
  the fused route of the same inputs.

Float64-truth check (``magi2_core.contracts.acceptance``: the routing contract) of every variant on
the random inputs and on adversarial ones (``plant_near_ties``: exact twins, twins far inside and
around the 1e-5 gap): rows, clear rows, near-tie rows, clear rows whose ids differ (must be 0), the
other violations, and whether the weights hold rtol = atol = 1e-6.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from magi2_backend_triton.moe_route_fused import CANDIDATES, RouteConfig, default_config, fused_route

import magi2_core as m2
from benchmarks._common import env_record, graphed, stats, time_alternating
from magi2_core.contracts.acceptance import accept_moe_route, route_truth, tally_route_ids
from magi2_core.testing.route import plant_near_ties

ROUTE_SCALE = 4.9
# (route share of the fused experts, at most), by (tokens, heads); and the fused route against vllm-omni's
TARGETS = {(512, 3): 0.10, (4096, 3): 0.05, (14601, 3): 0.05, (4096, 12): 0.05}
VS_VLLM = {(14601, 3): 0.5}
# A planted twin for every 16th expert: 16 pairs per head of 256, so clear rows stay common too.
PLANT_EVERY = 16


@dataclass(frozen=True)
class Setup:
    shapes: tuple[tuple[int, int], ...]  # (tokens, heads)
    experts: int
    d: int
    inter: int
    top_k: int
    configs: tuple[RouteConfig, ...]
    device: str


PRODUCTION = Setup(((512, 3), (4096, 3), (14601, 3), (4096, 12)), 256, 256, 1280, 6, CANDIDATES, "cuda")
DRY = Setup(((9, 3), (20, 2)), 16, 32, 64, 4, CANDIDATES[:2], "cpu")


# ---------------------------------------------------------------------------------------------
# vllm-omni's route, rebuilt from its behaviour (our code)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _upstream_topk_kernel(
    logits_ptr,
    bias_ptr,
    probs_ptr,
    idx_ptr,
    n_tok,
    E: tl.constexpr,
    K: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One (head, token) row per program: sigmoid, + bias, K rounds of (max, lowest index holding it),
    the unbiased scores of the winners, L1 normalisation with eps 1e-12 (``F.normalize(p=1)``)."""
    row = tl.program_id(0).to(tl.int64)
    head = row // n_tok
    cols = tl.arange(0, BLOCK_E)
    ok = cols < E
    z = tl.load(logits_ptr + row * E + cols, mask=ok, other=0.0)
    s = 1.0 / (1.0 + tl.exp(-z))
    sel = tl.where(ok, s + tl.load(bias_ptr + head * E + cols, mask=ok, other=0.0), float("-inf"))
    kc = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    wts = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k in range(K):
        best = tl.max(sel, axis=0)
        e = tl.min(tl.where(sel == best, cols, BLOCK_E), axis=0)
        hit = cols == e
        wts = tl.where(kc == k, tl.sum(tl.where(hit, s, 0.0), axis=0), wts)
        ids = tl.where(kc == k, e, ids)
        sel = tl.where(hit, float("-inf"), sel)
    wts = wts / tl.maximum(tl.sum(tl.abs(wts), axis=0), 1e-12)
    tl.store(probs_ptr + row * K + kc, wts, mask=kc < K)
    tl.store(idx_ptr + row * K + kc, ids.to(tl.int64), mask=kc < K)


def vllm_omni_main_route(
    x: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, ...]:
    t, hl, d = x.shape
    e = gate.shape[0] // hl
    logits = torch.einsum("shd,hed->hse", x.float(), gate.view(hl, e, d)).contiguous()
    probs = torch.empty(hl, t, top_k, dtype=torch.float32, device=x.device)
    idx = torch.empty(hl, t, top_k, dtype=torch.int64, device=x.device)
    if t:
        _upstream_topk_kernel[(hl * t,)](
            logits,
            bias,
            probs,
            idx,
            t,
            E=e,
            K=top_k,
            BLOCK_E=triton.next_power_of_2(e),
            BLOCK_K=triton.next_power_of_2(top_k),
            num_warps=1,
        )
    return probs * ROUTE_SCALE, idx


def vllm_omni_030_route(
    x: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, ...]:
    _, hl, d = x.shape
    e = gate.shape[0] // hl
    scores = torch.sigmoid(torch.einsum("shd,hed->hse", x.float(), gate.view(hl, e, d)))
    idx = torch.topk(scores + bias.view(hl, 1, e), top_k, dim=-1).indices
    probs = F.normalize(scores.gather(-1, idx), p=1, dim=-1, eps=1e-12)
    return probs * ROUTE_SCALE, idx


# ---------------------------------------------------------------------------------------------
# one shape
# ---------------------------------------------------------------------------------------------
def _inputs(s: Setup, t: int, hl: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hl, s.d, generator=g).bfloat16()
    router = torch.randn(hl * s.experts, s.d, generator=g) * s.d**-0.5
    bias = torch.randn(hl * s.experts, generator=g) * 0.01
    return x.to(s.device), router.to(s.device), bias.to(s.device)


def _routes(s: Setup, x: torch.Tensor, router: torch.Tensor, bias: torch.Tensor) -> dict[str, Callable[[], Any]]:
    hl, k = x.shape[1], s.top_k
    kw: dict[str, Any] = {"top_k": k, "route_scale": ROUTE_SCALE, "route_norm": True, "score_func": "sigmoid"}
    xf = x.float()
    w = router.view(hl, -1, s.d)
    fns: dict[str, Callable[[], Any]] = {}
    for c in s.configs:
        fns[f"fused[{c.name}]"] = lambda c=c: fused_route(x, router, bias, config=c, **kw)
    fns |= {
        "fused": lambda: m2.moe_route(x, router, bias, top_k=k, route_scale=ROUTE_SCALE, provider="triton_fused"),
        "triton": lambda: m2.moe_route(x, router, bias, top_k=k, route_scale=ROUTE_SCALE, provider="triton"),
        "torch": lambda: m2.moe_route(x, router, bias, top_k=k, route_scale=ROUTE_SCALE, provider="reference"),
        "vllm_omni_main": lambda: vllm_omni_main_route(x, router, bias, k),
        "vllm_omni_0.30": lambda: vllm_omni_030_route(x, router, bias, k),
    }
    fns["gemm_fp32"] = lambda: torch.bmm(xf.permute(1, 0, 2), w.transpose(1, 2))
    return fns


def _contract(
    fns: dict[str, Callable[[], Any]], x: torch.Tensor, router: torch.Tensor, bias: torch.Tensor, top_k: int
) -> dict[str, Any]:
    """The routing contract of every route variant on these inputs (float64 truth)."""
    truth = route_truth(x, router, bias, top_k=top_k, route_scale=ROUTE_SCALE, route_norm=True, score_func="sigmoid")
    out: dict[str, Any] = {}
    for name, fn in fns.items():
        if name == "gemm_fp32":
            continue
        probs, idx = fn()
        verdict = accept_moe_route(probs, idx, truth)
        out[name] = tally_route_ids(idx, truth).as_dict() | {"contract_ok": verdict.ok, "detail": verdict.detail}
    return out


def _experts(s: Setup, x: torch.Tensor, probs: torch.Tensor, idx: torch.Tensor, seed: int) -> Callable[[], Any]:
    g = torch.Generator(device=s.device).manual_seed(seed)  # drawn where they live: 6 GB at 12 heads
    f = x.shape[1] * s.experts

    def rnd(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=s.device) * scale).bfloat16()

    prepared = m2.prepare_moe_weights(
        rnd(f, s.d, s.inter, scale=1 / 16),
        rnd(f, s.d, s.inter, scale=1 / 16),
        rnd(f, s.inter, s.d, scale=s.inter**-0.5),
    )
    return lambda: m2.moe_experts(x, probs, idx, prepared)


def profile(s: Setup, t: int, hl: int, iters: int) -> dict[str, Any]:
    x, router, bias = _inputs(s, t, hl, seed=t * 31 + hl)
    fns = _routes(s, x, router, bias)
    probs, idx = fns["fused"]()
    fns_timed = dict(fns) | {"experts": _experts(s, x, probs, idx, seed=t + hl)}
    times = time_alternating({k: graphed(f, s.device) for k, f in fns_timed.items()}, iters, warmup=3, device=s.device)
    ms = {k: stats(v) for k, v in times.items()}
    del fns_timed
    g = torch.Generator().manual_seed(t)
    p_router, p_bias = plant_near_ties(g, router, bias, num_heads=hl, every=PLANT_EVERY)
    assert p_bias is not None
    accuracy = {
        "random": _contract(fns, x, router, bias, s.top_k),
        "planted": _contract(_routes(s, x, p_router, p_bias), x, p_router, p_bias, s.top_k),
    }
    experts = ms["experts"]["p50"]
    p50 = {k: v["p50"] for k, v in ms.items()}
    cands = {k: v for k, v in p50.items() if k.startswith("fused[")}  # every config as shipped
    best = min(cands, key=cands.__getitem__)
    return {
        "tokens": t,
        "heads": hl,
        "default_config": default_config(t * hl).name,
        "best_config": best,
        "ms": ms,
        "share_of_experts": {k: v / experts for k, v in p50.items() if k != "experts"},
        "fused_over_vllm_omni_main": p50["fused"] / p50["vllm_omni_main"],
        "best_over_vllm_omni_main": cands[best] / p50["vllm_omni_main"],
        "accuracy": accuracy,
    }


def targets(rows: list[dict[str, Any]]) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for r in rows:
        key = (r["tokens"], r["heads"])
        at = f"T={r['tokens']} x {r['heads']} heads"
        if key in TARGETS:
            out[f"fused route <= {TARGETS[key]:.0%} of the experts at {at}"] = (
                r["share_of_experts"]["fused"] <= TARGETS[key]
            )
        if key in VS_VLLM:
            out[f"fused route <= {VS_VLLM[key]}x vllm-omni's at {at}"] = r["fused_over_vllm_omni_main"] <= VS_VLLM[key]
        for inputs in ("random", "planted"):
            acc = r["accuracy"][inputs]
            fused = [v for k, v in acc.items() if k.startswith("fused")]
            out[f"0 clear-row id differences, fused, {inputs} inputs, {at}"] = all(
                v["clear_rows_wrong"] == 0 for v in fused
            )
            out[f"routing contract holds, fused, {inputs} inputs, {at}"] = all(v["contract_ok"] for v in fused)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/route_fused_h200.json")
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU under TRITON_INTERPRET=1")
    args = ap.parse_args()
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("--dry-run runs the kernels through the Triton interpreter: set TRITON_INTERPRET=1")
    s = DRY if args.dry_run else PRODUCTION
    iters = 2 if args.dry_run else args.iters
    report: dict[str, Any] = {
        "benchmark": "route_profile",
        **env_record(s.device),
        "shape": {
            "experts": s.experts,
            "d": s.d,
            "intermediate": s.inter,
            "top_k": s.top_k,
            "route_scale": ROUTE_SCALE,
        },
        "configs": [c._asdict() | {"name": c.name} for c in s.configs],
        "method": "CUDA graph replay per variant, calls alternating, L2 flushed before each (256 MiB zeroed)",
        "rows": [],
    }
    for t, hl in s.shapes:
        r = profile(s, t, hl, iters)
        report["rows"].append(r)
        line = "  ".join(f"{k} {v['p50']:.4f}" for k, v in r["ms"].items())
        print(f"T={t} x {hl}: {line}", flush=True)
        print(
            f"    share of experts: fused {r['share_of_experts']['fused']:.3f}, best {r['best_config']} "
            f"{r['share_of_experts'][r['best_config']]:.3f}; "
            f"fused / vllm-omni main {r['fused_over_vllm_omni_main']:.2f}"
        )
        for inputs, acc in r["accuracy"].items():
            for name, v in acc.items():
                if not v["contract_ok"] or name in ("fused", "triton", "vllm_omni_main"):
                    print(f"    {inputs} {name}: {v['detail']}")
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    report["targets"] = targets(report["rows"])
    report["all_targets_met"] = all(report["targets"].values())
    for name, ok in report["targets"].items():
        print(f"{'met   ' if ok else 'MISSED'} {name}")
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
