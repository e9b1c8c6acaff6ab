"""Fused ``mhc_mix_pre`` (Triton) vs the two ops it fuses, ``mhc_mix`` then ``mhc_pre`` (Triton), and the native form.

    python -m benchmarks.mhc_mix_pre [--iters N] [--tokens T] [--modalities 1|3] [--json PATH] [--smoke]

What a MAGI-2 layer runs between its attention and MLP branches: the attention branch's mix, then the MLP
branch's mHC input from the new streams (``[T, 4, 3072]`` BF16; at the one-GPU layer's 14,601 tokens by
default; one modality group, as the MoE layers' mHC norm, or the pack's three). Variants, alternating call
by call, each after an L2 flush (``benchmarks/_common.py``): the fused op at its shipped launch and at
the launches in ``CANDIDATES``; ``mhc_mix`` then ``mhc_pre`` on their Triton providers (the plugin's path
without the fusion); the ``torch_native`` provider's code (vllm-omni's native form) eager and compiled.
Bandwidth on the minimum bytes: the streams and the branch output read once, the new streams and the branch
input written once (the fused design reads the new streams once more, for the branch input). Before timing,
every fused launch is judged against the float64 reference by the contract's rules (operators.md §5.4)
and run twice: a launch whose two runs differ is reported, not timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import torch
from magi2_backend_reference.torch_mhc import torch_mhc_mix_pre
from magi2_backend_triton.mhc_mix_pre import MIX_PRE, MixPreConfig, launch_mhc_mix_pre

import magi2_core as m2
from benchmarks._common import env_record, measure_ceilings, stats, time_alternating
from benchmarks.mhc import STREAMS, WIDTH, _sizes
from magi2_core.ops.mhc_mix_pre import SPEC
from magi2_core.testing import call_record
from magi2_core.testing.op_cases.mhc_pre import mhc_parameters, mhc_streams

LAYER_TOKENS = 14601
CANDIDATES = (
    MixPreConfig(block_t=32, block_d=64, num_warps=4, num_stages=2, split_d=1),
    MixPreConfig(block_t=128, block_d=64, num_warps=8, num_stages=2, split_d=1),
    MixPreConfig(block_t=64, block_d=64, num_warps=4, num_stages=3, split_d=2),
)


def _name(cfg: MixPreConfig) -> str:
    return f"fused t{cfg.block_t} d{cfg.block_d} w{cfg.num_warps} s{cfg.num_stages} x{cfg.split_d}"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tokens", type=int, default=LAYER_TOKENS)
    ap.add_argument("--modalities", type=int, choices=(1, 3), default=1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default="benchmarks/results/mhc_mix_pre.json")
    ap.add_argument("--smoke", action="store_true", help="a tiny pack on the CPU (TRITON_INTERPRET=1)")
    a = ap.parse_args()
    device = "cpu" if a.smoke else "cuda"
    t, width = (40, 64) if a.smoke else (a.tokens, WIDTH)
    sizes = _sizes(t) if a.modalities == 3 else [t]
    g = torch.Generator().manual_seed(0)
    x = mhc_streams(g, t, STREAMS, width, torch.bfloat16)
    y = torch.randn((t, width), generator=g, dtype=torch.float64).to(torch.bfloat16)
    post = (2 * torch.rand((t, STREAMS), generator=g, dtype=torch.float64)).to(torch.bfloat16)
    res = torch.softmax(torch.randn((t, STREAMS, STREAMS), generator=g, dtype=torch.float64), -1).to(torch.bfloat16)
    cpu_args = (x, y, post, res, *mhc_parameters(g, len(sizes), STREAMS, width))
    args = tuple(v.to(device) for v in cpu_args)
    call = call_record("mhc_mix_pre", *args, modality_sizes=sizes)
    ref = m2.mhc_mix_pre(*cpu_args, modality_sizes=sizes, provider="reference")
    cpu_call = call_record("mhc_mix_pre", *cpu_args, modality_sizes=sizes)
    names = SPEC.output_names

    rows: list[dict[str, Any]] = []
    fns: dict[str, Callable[[], object]] = {}
    configs = (MIX_PRE,) if a.smoke else tuple(dict.fromkeys((MIX_PRE, *CANDIDATES)))
    for cfg in configs:
        name = _name(cfg) + (" (shipped)" if cfg == MIX_PRE else "")
        try:
            got = launch_mhc_mix_pre(call, cfg)
        except Exception as exc:  # a launch this Triton cannot compile (shared memory, registers)
            error = f"{type(exc).__name__}: {exc}"[:300]
            rows.append({"name": name, "config": dataclasses.asdict(cfg), "error": error})
            continue
        verdicts = SPEC.accept(
            None, {k: v.cpu() for k, v in zip(names, got, strict=True)}, dict(zip(names, ref, strict=True)), cpu_call
        )
        again = launch_mhc_mix_pre(call, cfg)
        repeatable = all(torch.equal(u, v) for u, v in zip(got, again, strict=True))
        ok = repeatable and all(bool(v) for v in verdicts)
        rows.append(
            {
                "name": name,
                "config": dataclasses.asdict(cfg),
                "repeatable": repeatable,
                "pass": ok,
                "verdicts": [str(v) for v in verdicts],
            }
        )
        if ok:
            fns[name] = lambda cfg=cfg: launch_mhc_mix_pre(call, cfg)
        del got, again

    def unfused() -> object:
        new = m2.mhc_mix(*args[:4], provider="triton")
        return m2.mhc_pre(new, *args[4:], modality_sizes=sizes, provider="triton")

    native_compiled = torch.compile(torch_mhc_mix_pre)
    fns["mhc_mix + mhc_pre (triton)"] = unfused
    fns["native eager"] = lambda: torch_mhc_mix_pre(call)
    fns["native compiled"] = lambda: native_compiled(call)
    rows += [{"name": n} for n in ("mhc_mix + mhc_pre (triton)", "native eager", "native compiled")]

    minimum = (2 * x.numel() + 2 * y.numel()) * x.element_size()
    if a.smoke:  # each variant runs once; nothing is timed on the CPU
        ceilings, times = None, {}
        for fn in fns.values():
            fn()
    else:
        ceilings = measure_ceilings()
        times = time_alternating(fns, a.iters)
    for row in rows:
        if row["name"] in times:
            st = stats(times[row["name"]])
            row |= {"p10_ms": st["p10"], "p50_ms": st["p50"], "p90_ms": st["p90"]}
            if ceilings is not None:
                row["of_copy_minimum_bytes"] = minimum / (st["p50"] * 1e-3) / 1e12 / ceilings.copy_tb_s
    rows.sort(key=lambda r: r.get("p50_ms", float("inf")))
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        record = {
            "benchmark": "mhc_mix_pre",
            "env": {**env_record(device), "ceilings": None if ceilings is None else ceilings.record()},
            "tokens": t,
            "streams": STREAMS,
            "width": width,
            "modality_sizes": sizes,
            "minimum_bytes": minimum,
            "shipped": dataclasses.asdict(MIX_PRE),
            "rows": rows,
        }
        json.dump(record, f, indent=2)
    if ceilings is not None:
        print(f"this device's copy {ceilings.copy_tb_s:.2f} TB/s, measured in this run; {t} tokens, groups {sizes}")
    for r in rows:
        if "p50_ms" in r:
            frac = f"  {r['of_copy_minimum_bytes']:.2f} of copy on the minimum bytes" if ceilings is not None else ""
            verdict = "" if "pass" not in r else "  PASS" if r["pass"] else "  FAIL " + "; ".join(r["verdicts"])
            print(f"{r['name']:44s} p50 {r['p50_ms']:.3f} ms ({r['p10_ms']:.3f}-{r['p90_ms']:.3f}){frac}{verdict}")
        else:
            print(f"{r['name']:44s} not timed: {r.get('error') or '; '.join(r.get('verdicts', [])) or 'a smoke run'}")


if __name__ == "__main__":
    main()
