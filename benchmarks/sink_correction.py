"""Fused sink correction (Triton) vs the plain torch correction, on MAGI-2 attention outputs.

    python -m benchmarks.sink_correction [--sweep] [--iters N] [--json PATH]

o ``[T, 24, 128]`` BF16, lse ``[24, T]`` FP32, one sink (production). T: 16×256 = 4096 (the
launch-bound case), 8×1024, 2×14601, 32768 (the correction does not care about segments; only T
matters). Bytes = o read + o' written + lse read; TB/s is compared with a device copy of o (same
bytes minus the LSE) timed in the same run, and with this device's copy bandwidth, measured in the
same run (``measure_ceilings``, recorded under ``env.ceilings``). Timing from
``benchmarks/_common.py``: alternating calls, L2 flushed before each, CUDA events, p50 and p10/p90.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

import torch
import triton
from magi2_backend_triton import sink_correction as sink_mod
from magi2_backend_triton.sink_correction import triton_sink_correction

from benchmarks._common import measure_ceilings, time_alternating
from benchmarks.rmsnorm import env_info, summarize

H, D = 24, 128
SHAPES = [("16x256", 4096), ("8x1024", 8192), ("2x14601", 29202), ("1x32768", 32768)]
SWEEP = [(8, 2), (16, 4), (32, 4), (32, 8), (64, 4), (64, 8)]  # (BLOCK_T, num_warps)


def torch_correction(
    o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, rescale: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain torch correction (operators.md §2.3, as upstream): one kernel per step."""
    sink_lse = torch.logsumexp(sinks, dim=0, keepdim=True)
    lse_th = lse.transpose(0, 1)
    new_lse = torch.logaddexp(lse_th, sink_lse)
    delta = lse_th - new_lse
    delta = torch.where(torch.isfinite(delta), delta, torch.full_like(delta, float("-inf")))
    scale = torch.exp(delta).unsqueeze(-1)
    out = (o.float() * scale).to(o.dtype) if rescale == "fp32" else o * scale.to(o.dtype)
    return out, new_lse.transpose(0, 1).contiguous()


def bench(label: str, t: int, iters: int, sweep: bool, copy_tb_s: float) -> dict[str, Any]:
    o = torch.randn(t, H, D, device="cuda").to(torch.bfloat16)
    lse = torch.randn(H, t, device="cuda") * 3 + 5
    sinks = torch.randn(1, H, device="cuda")
    out = torch.empty_like(o)
    nbytes = 2 * o.numel() * o.element_size() + lse.numel() * 4

    exact = {}
    for mode in ("fp32", "activation"):
        mine = triton_sink_correction(o, lse, sinks, rescale=mode)
        ref = torch_correction(o, lse, sinks, mode)[0]
        exact[mode] = int((mine.view(torch.int16) != ref.view(torch.int16)).sum())

    fns: dict[str, Callable[[], object]] = {
        "fused_fp32": lambda: triton_sink_correction(o, lse, sinks, rescale="fp32", out=out),
        "fused_activation": lambda: triton_sink_correction(o, lse, sinks, rescale="activation", out=out),
        "torch_fp32": lambda: torch_correction(o, lse, sinks, "fp32"),
        "torch_activation": lambda: torch_correction(o, lse, sinks, "activation"),
        "copy_o": lambda: out.copy_(o),
    }
    res = {k: summarize(v, nbytes, copy_tb_s) for k, v in time_alternating(fns, iters).items()}
    copy_ms = res["copy_o"]["p50_ms"]
    for v in res.values():
        v["frac_of_copy_time"] = copy_ms / v["p50_ms"]
    row: dict[str, Any] = {
        "name": label,
        "T": t,
        "H": H,
        "D": D,
        "bytes": nbytes,
        "differing_bf16_values_vs_torch": exact,
        "tile": list(sink_mod._tile(D)),
        "results": res,
    }
    if sweep:
        default_tile = sink_mod._tile
        cfgs: dict[str, Callable[[], object]] = {}
        for block_t, warps in SWEEP:

            def run(cfg: tuple[int, int, int] = (block_t, triton.next_power_of_2(D), warps)) -> object:
                sink_mod._tile = lambda _d: cfg  # type: ignore[assignment]
                try:
                    return triton_sink_correction(o, lse, sinks, rescale="fp32", out=out)
                finally:
                    sink_mod._tile = default_tile

            cfgs[f"t{block_t}_w{warps}"] = run
        sw = time_alternating(cfgs, max(10, iters // 2))
        row["sweep"] = {k: summarize(v, nbytes, copy_tb_s)["tb_s"] for k, v in sw.items()}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json", default="benchmarks/results/sink_correction_h200.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    ceilings = measure_ceilings()
    info = env_info(ceilings)
    rows: list[dict[str, Any]] = []
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    for label, t in SHAPES:
        rows.append(bench(label, t, args.iters, args.sweep, ceilings.copy_tb_s))
        with open(args.json, "w") as f:  # rewritten after each shape: a cut-off run keeps its rows
            json.dump({"benchmark": "sink_correction", "env": info, "rows": rows}, f, indent=2)
    print(f"this device's copy {ceilings.copy_tb_s:.2f} TB/s, measured in this run; vs copy = copy of o's time / p50")
    print(f"{'T':10s} {'variant':18s} {'p50 us':>8s} {'p10':>7s} {'p90':>7s} {'TB/s':>6s} {'vs copy':>7s}")
    for r in rows:
        for k, v in r["results"].items():
            print(
                f"{r['name']:10s} {k:18s} {v['p50_ms'] * 1e3:8.1f} {v['p10_ms'] * 1e3:7.1f} "
                f"{v['p90_ms'] * 1e3:7.1f} {v['tb_s']:6.2f} {v['frac_of_copy_time']:7.2f}"
            )
        print(
            f"{'':10s} bf16 diffs vs torch {r['differing_bf16_values_vs_torch']} tile {r['tile']} "
            f"sweep {r.get('sweep', {})}"
        )


if __name__ == "__main__":
    main()
