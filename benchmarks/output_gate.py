"""Fused ``output_gate`` (Triton) vs vllm-omni 0.30.0's own form, eager and compiled.

    python -m benchmarks.output_gate [--iters N] [--tokens T] [--json PATH] [--smoke]

The output gate of one attention's ``output`` at the 272p / 10 s CFG pack (29,912 tokens, 24 heads of 128,
BF16, 3 modalities, tokens interleaved so ``permute`` is a real gather): the attention result's rows
gathered into modality order and each head scaled by ``sigmoid`` of its gate logit. The native form is
upstream's expression (``index_select``, ``* sigmoid(gates)``, reshape, cast), eager, under
``torch.compile`` on static shapes, and under ``torch.compile(dynamic=True)``, as vllm-omni's
``compile_regions`` compiles it with the plugin off (inductor's kernel differs: the step's breakdown
showed the dynamic one about 4x slower). All variants alternate
call by call, each after an L2 flush, timed with CUDA events (``benchmarks/_common.py``). Bandwidth is
on the minimum bytes (the attention output read once and the gated rows written once in BF16, the
logits and the index read once), also as a fraction of this device's copy bandwidth measured in the same
run. Before timing, the fused result is judged against the float64 reference by the contract's rule
(operators.md §7.2). ``--smoke`` runs a tiny pack on the CPU under the Triton interpreter (no ceilings,
no fractions): it keeps the script working where there is no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

import torch

import magi2_core as m2
from benchmarks._common import env_record, measure_ceilings, stats, time_alternating
from magi2_core.contracts import acceptance as acc

HEADS, HEAD_DIM = 24, 128
PACK_TOKENS = 29912


def upstream_form(attention: torch.Tensor, gates: torch.Tensor, permute: torch.Tensor) -> torch.Tensor:
    """vllm-omni's ``Magi2Attention.output`` before its projection: gather, gate, reshape, cast."""
    out = attention.index_select(0, permute) * torch.sigmoid(gates)
    return out.reshape(out.shape[0], -1).to(torch.bfloat16)


def bench(t: int, iters: int, device: str = "cuda") -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    audio, text = t // 60, t // 40
    sizes = [t - audio - text, audio, text]
    modality = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])[torch.randperm(t, generator=g)]
    permute = torch.argsort(modality, stable=True).to(device)  # vllm-omni's permute_mapping
    o = torch.randn(t, HEADS, HEAD_DIM, generator=g).to(torch.bfloat16).to(device)
    gates = (3 * torch.randn(t, HEADS, 1, generator=g)).to(torch.bfloat16).to(device)
    got = m2.output_gate(o, gates, index=permute, provider="triton")
    ref = m2.output_gate(o, gates, index=permute, provider="reference")
    theirs = upstream_form(o, gates, permute).view_as(ref)
    verdicts = [f"triton: {acc.accept_output_gate(got, ref, gates)}"]
    verdicts.append(f"upstream eager: {acc.accept_output_gate(theirs, ref, gates)}")
    del got, ref, theirs

    compiled = torch.compile(upstream_form)
    dynamic = torch.compile(upstream_form, dynamic=True)
    fns: dict[str, Callable[[], object]] = {
        "fused_triton": lambda: m2.output_gate(o, gates, index=permute, provider="triton"),
        "native_eager": lambda: upstream_form(o, gates, permute),
        "native_compiled": lambda: compiled(o, gates, permute),
        "native_compiled_dynamic": lambda: dynamic(o, gates, permute),
    }
    minimum = 2 * t * HEADS * HEAD_DIM * 2 + gates.numel() * 2 + permute.numel() * 8
    results = {}
    for name, samples in time_alternating(fns, iters, device=device).items():
        st = stats(samples)
        results[name] = {
            "p10_ms": st["p10"],
            "p50_ms": st["p50"],
            "p90_ms": st["p90"],
            "tb_s_minimum_bytes": minimum / (st["p50"] * 1e-3) / 1e12,
        }
    return {
        "tokens": t,
        "heads": HEADS,
        "head_dim": HEAD_DIM,
        "modality_sizes": sizes,
        "minimum_bytes": minimum,
        "acceptance": verdicts,
        "results": results,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=PACK_TOKENS)
    ap.add_argument("--json", default="benchmarks/results/output_gate.json")
    ap.add_argument("--smoke", action="store_true", help="a tiny pack on the CPU (TRITON_INTERPRET=1)")
    args = ap.parse_args()
    if args.smoke:
        info = {**env_record("cpu"), "ceilings": None}
        row = bench(min(args.tokens, 40), min(args.iters, 2), device="cpu")
    else:
        ceilings = measure_ceilings()
        info = {**env_record(), "ceilings": ceilings.record()}
        row = bench(args.tokens, args.iters)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": "output_gate", "env": info, "rows": [row]}, f, indent=2)
    if args.smoke:
        print("; ".join(row["acceptance"]))
        return
    copy = ceilings.copy_tb_s
    print(
        f"this device's copy {copy:.2f} TB/s, measured in this run; {row['tokens']} tokens; "
        + "; ".join(row["acceptance"])
    )
    for name, r in row["results"].items():
        print(
            f"{name:16s} p50 {r['p50_ms']:.3f} ms (p10 {r['p10_ms']:.3f}, p90 {r['p90_ms']:.3f})  "
            f"{r['tb_s_minimum_bytes']:.2f} TB/s on the minimum bytes ({r['tb_s_minimum_bytes'] / copy:.2f} of copy)"
        )


if __name__ == "__main__":
    main()
