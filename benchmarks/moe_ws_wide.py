"""The 64-wide-slice prototype (`benchmarks/_moe_ws_wide.py`) against the shipped ``gluon_ws`` kernel.

    python -m benchmarks.moe_ws_wide --out benchmarks/results/moe_ws_wide_h100.json

Per shape (tokens x heads of 256 experts, top-6, d = 256, I = 1280, BF16, prepared weights, random
routes): the call's own plan (``gluon_ws`` at these shapes on Hopper) runs through ``run_fused``, once
with the shipped launcher and once with the prototype's in its place (same alignment, same top-k sum).
Recorded: whether the two outputs are bit for bit equal (they should be: same products, same
accumulation order, same roundings), then both calls captured in CUDA graphs and replayed in turn with
the L2 flushed before each (device events, p50 and p10-p90). The JSON is rewritten after every step, so
a hang (the prototype has never run before) still leaves what ran. GPU only.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import magi2_core as m2
from benchmarks._common import env_record, graphed, stats, time_alternating

SHAPES = [(4096, 3), (14601, 12), (14601, 3)]
E, K, D, INTER = 256, 6, 256, 1280


def _inputs(tokens: int, heads: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, heads, D, device="cuda", generator=g).to(torch.bfloat16)
    scores = torch.rand(heads, tokens, E, device="cuda", generator=g)
    idx = scores.topk(K, dim=-1).indices
    probs = torch.rand(heads, tokens, K, device="cuda", generator=g) + 0.1
    probs = probs / probs.sum(-1, keepdim=True)
    f = heads * E
    wg = (torch.randn(f, D, INTER, device="cuda", generator=g) / D**0.5).to(torch.bfloat16)
    wu = (torch.randn(f, D, INTER, device="cuda", generator=g) / D**0.5).to(torch.bfloat16)
    wd = (torch.randn(f, INTER, D, device="cuda", generator=g) / INTER**0.5).to(torch.bfloat16)
    prepared = m2.prepare_moe_weights(wg, wu, wd)
    del wg, wu
    return x, probs, idx, prepared.w_gate, prepared.w_up, prepared.w_down


def _shape(row: dict[str, Any], tokens: int, heads: int, iters: int, write: Callable[[], None]) -> None:
    from magi2_backend_triton.moe import fused

    from benchmarks._moe_ws_wide import launch_gluon_ws_wide

    shipped = fused._LAUNCHERS["gluon_ws"]
    args = _inputs(tokens, heads, seed=tokens + heads)
    run = fused.run_fused(*args)
    row["plan"] = run.plan.describe() if run.plan is not None else None
    want = run.y.clone()
    fused._LAUNCHERS["gluon_ws"] = launch_gluon_ws_wide
    try:
        got = fused.run_fused(*args).y
        torch.cuda.synchronize()
        row["bit_equal"] = bool(torch.equal(got, want))
        row["max_abs_diff"] = float((got.float() - want.float()).abs().max())
        write()
        print(f"T={tokens} H={heads}: plan {row['plan']}; bit-equal {row['bit_equal']}", flush=True)
        wide = graphed(lambda: fused.run_fused(*args))
    finally:
        fused._LAUNCHERS["gluon_ws"] = shipped
    base = graphed(lambda: fused.run_fused(*args))
    times = time_alternating({"shipped": base, "wide": wide}, iters=iters)
    row["ms"] = {name: stats(t) for name, t in times.items()}
    row["wide_over_shipped"] = row["ms"]["wide"]["p50"] / row["ms"]["shipped"]["p50"]
    write()
    print(f"  shipped {row['ms']['shipped']['p50']:.3f} ms, wide {row['ms']['wide']['p50']:.3f} ms", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--iters", type=int, default=20)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    report: dict[str, Any] = {**env_record("cuda"), "shapes": []}

    def write() -> None:
        a.out.write_text(json.dumps(report, indent=1))

    write()
    for tokens, heads in SHAPES:
        row: dict[str, Any] = {"tokens": tokens, "heads": heads}
        report["shapes"].append(row)
        with torch.inference_mode():
            _shape(row, tokens, heads, a.iters, write)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
