"""The fused ``mhc_pre``'s logits kernel over launch configurations, at the 272p / 10 s pack.

    python -m benchmarks.mhc_sweep [--tokens T] [--modalities 1|3] [--iters N] [--json PATH]

The logits kernel reads each token's flattened ``n·D`` row once (the sum of squares and the FP32
projection onto ``phi``); it is the part of ``mhc_pre`` whose speed depends on its tiles and on the
precision of its FP32 ``tl.dot`` (``ieee``, ``tf32x3``, or the BF16 streams against the
folded weight split in three BF16 pieces, ``bf16x3``, whose rows may be split in ``split_k`` chunks).
Per :class:`magi2_backend_triton.mhc_pre.LogitsConfig`: the whole
``mhc_pre`` call's time (CUDA events, the L2 flushed before each call, all configurations
alternating), its bandwidth on the bytes it must move (the streams read twice, the branch input
written) as a fraction of this device's copy bandwidth (measured in the same run,
``_common.measure_ceilings``, recorded under ``env.ceilings``), and its error against the float64
reference: the verdicts of the contract's rules (operators.md §5.4) on the branch input and the
coefficients, and whether a second run is bitwise the same (a launch that races is not).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
from typing import Any

import torch
from magi2_backend_triton import mhc_pre as kernel

import magi2_core as m2
from benchmarks._common import env_record, measure_ceilings, stats, time_alternating
from benchmarks.mhc import PACK_TOKENS, STREAMS, WIDTH, _sizes
from magi2_core.contracts import acceptance as acc
from magi2_core.testing import call_record
from magi2_core.testing.op_cases.mhc_pre import mhc_parameters, mhc_streams

CANDIDATES = (
    [
        kernel.LogitsConfig(block_t=bt, block_k=bk, precision=p, num_warps=w, num_stages=s)
        for p, bt, bk, w, s in itertools.product(("ieee", "tf32x3"), (32, 64), (64, 128), (4, 8), (2, 3, 4))
        if not (p == "ieee" and bt == 64 and w == 4)
    ]
    + [
        kernel.LogitsConfig(block_t=bt, block_k=bk, precision="bf16x3", num_warps=w, num_stages=s, split_k=sk)
        for bt, bk, w, s, sk in itertools.product((64, 128), (64, 128), (4, 8), (3, 4), (1, 2, 4))
    ]
    + [
        kernel.LogitsConfig(block_t=bt, block_k=64, precision="bf16x3", num_warps=w, num_stages=4, split_k=8)
        for bt, w in ((64, 4), (128, 8), (128, 4))
    ]
)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--tokens", type=int, default=PACK_TOKENS)
    ap.add_argument(
        "--modalities",
        type=int,
        choices=(1, 3),
        default=3,
        help="3: the pack's video, audio and text groups; 1: one group (the MoE layers' mHC norm)",
    )
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default="benchmarks/results/mhc_sweep.json")
    ap.add_argument("--precision", choices=kernel._PRECISIONS, help="only this precision's launches (and the default)")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    t, sizes = a.tokens, (_sizes(a.tokens) if a.modalities == 3 else [a.tokens])
    x = mhc_streams(g, t, STREAMS, WIDTH, torch.bfloat16).cuda()
    params = tuple(p.cuda() for p in mhc_parameters(g, len(sizes), STREAMS, WIDTH))
    call = call_record("mhc_pre", x, *params, modality_sizes=sizes)
    ref = m2.mhc_pre(x, *params, modality_sizes=sizes, provider="reference")
    ceilings = measure_ceilings()
    copy = ceilings.copy_tb_s
    moved = 2 * x.numel() * 2 + t * WIDTH * 2

    rows: list[dict[str, Any]] = []
    fns = {}
    for cfg in CANDIDATES:
        if a.precision and cfg.precision != a.precision and cfg not in (kernel.LOGITS, kernel.LOGITS_FP32):
            continue
        name = f"{cfg.precision} t{cfg.block_t} k{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} x{cfg.split_k}"
        try:
            got = kernel.launch_mhc_pre(call, cfg)
        except Exception as exc:  # a configuration this Triton cannot compile (shared memory)
            rows.append(
                {"config": dataclasses.asdict(cfg), "name": name, "error": f"{type(exc).__name__}: {exc}"[:300]}
            )
            continue
        verdicts = [
            acc.accept_mhc_branch_input(got[0], ref[0], x),
            acc.accept_mhc_coefficients(got[1], ref[1], "post"),
            acc.accept_mhc_coefficients(got[2], ref[2], "residual"),
        ]
        again = kernel.launch_mhc_pre(call, cfg)  # a race shows as a second run that differs
        repeatable = all(torch.equal(u, v) for u, v in zip(got, again, strict=True))
        rows.append(
            {
                "config": dataclasses.asdict(cfg),
                "name": name,
                "repeatable": repeatable,
                "pass": repeatable and all(bool(v) for v in verdicts),
                "verdicts": [str(v) for v in verdicts],
            }
        )
        del again
        fns[name] = lambda cfg=cfg: kernel.launch_mhc_pre(call, cfg)
        del got
    times = time_alternating(fns, a.iters)
    for row in rows:
        if row["name"] in times:
            st = stats(times[row["name"]])
            row |= {
                "p10_ms": st["p10"],
                "p50_ms": st["p50"],
                "p90_ms": st["p90"],
                "of_copy": moved / (st["p50"] * 1e-3) / 1e12 / copy,
            }
    rows.sort(key=lambda r: r.get("p50_ms", float("inf")))
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(
            {
                "benchmark": "mhc_sweep",
                "env": {**env_record(), "ceilings": ceilings.record()},
                "tokens": t,
                "modality_sizes": sizes,
                "default": dataclasses.asdict(kernel.LOGITS),
                "moved_bytes": moved,
                "rows": rows,
            },
            f,
            indent=2,
        )
    print(
        f"this device's copy {copy:.2f} TB/s, measured in this run; mhc_pre on {t} tokens x {STREAMS} x {WIDTH}, "
        f"modality groups {sizes}; "
        f"default {kernel.LOGITS}"
    )
    for r in rows:
        if "p50_ms" in r:
            print(
                f"{r['name']:28s} p50 {r['p50_ms']:.3f} ms ({r['p10_ms']:.3f}-{r['p90_ms']:.3f}) "
                f"{r['of_copy']:.2f} of this device's copy  "
                f"{'PASS' if r['pass'] else 'FAIL ' + ('' if r['repeatable'] else 'two runs differ; ')}"
                f"{'' if r['pass'] else '; '.join(r['verdicts'])}"
            )
        else:
            print(f"{r['name']:28s} {r.get('error', '')}")


if __name__ == "__main__":
    main()
