"""Fused multi-modality RMSNorm (Triton) vs the FP32 composite, eager and under torch.compile.

    python -m benchmarks.rmsnorm [--sweep] [--iters N] [--json PATH]

Composite = what the reference backend does (operators.md §4.3): ``F.rms_norm`` on the FP32 input without
affine weight, ``(w[m] + 1)`` per modality group, one cast. All variants run in the same process,
alternating call by call, each call after an L2 flush (a 256 MiB buffer zeroed), timed with CUDA
events after warm-up. Bandwidth = (bytes of x read + bytes of y written + weight) / time, reported
as TB/s and as a fraction of this device's copy bandwidth, measured in the same run
(``measure_ceilings``, recorded under ``env.ceilings``). ``--sweep`` times alternative tile configs of
the fused kernel. Timing, flush, statistics, the ceilings and the environment record come from
``benchmarks/_common.py``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
import triton
from magi2_backend_triton import rmsnorm as rms_mod
from magi2_backend_triton.rmsnorm import triton_rmsnorm

from benchmarks._common import Ceilings, env_record, measure_ceilings, stats, time_alternating

EPS = 1e-6


def summarize(ms: Sequence[float], nbytes: int, copy_tb_s: float) -> dict[str, float]:
    """p10/p50/p90, the bandwidth on ``nbytes`` and its fraction of ``copy_tb_s`` (this device's copy)."""
    st = stats(ms)
    tbs = nbytes / (st["p50"] * 1e-3) / 1e12
    return {
        "p10_ms": st["p10"],
        "p50_ms": st["p50"],
        "p90_ms": st["p90"],
        "tb_s": tbs,
        "frac_copy_ceiling": tbs / copy_tb_s,
    }


def env_info(ceilings: Ceilings) -> dict[str, Any]:
    return {**env_record(), "ceilings": ceilings.record()}


def composite(
    x: torch.Tensor,
    weight: torch.Tensor,
    sizes: Sequence[int] | None,
    out_dtype: torch.dtype | None,
) -> torch.Tensor:
    """The reference-backend composite: FP32 F.rms_norm, per-group (w[m] + 1), one cast."""
    n = F.rms_norm(x.float(), (x.shape[-1],), None, EPS)
    scale = weight + 1  # [M, P, D]; scale[m] broadcasts over tokens (and heads when P == 1)
    if sizes is None:
        y = n * scale[0]
    else:
        y = torch.cat([c * scale[m] for m, c in enumerate(n.split(list(sizes), dim=0))], dim=0)
    return y.to(out_dtype or x.dtype)


# name, x shape, dtype, out dtype, modality sizes, weight [M, P, D]
SHAPES: list[tuple[str, tuple[int, ...], torch.dtype, torch.dtype | None, list[int] | None]] = [
    ("prenorm_3mod_65536x3072", (65536, 3072), torch.bfloat16, None, [40960, 16384, 8192]),
    ("prenorm_1mod_65536x3072", (65536, 3072), torch.bfloat16, None, None),
    ("qknorm_14601x24x128_fp32out", (14601, 24, 128), torch.bfloat16, torch.float32, None),
    ("mhc_16384x12288_fp32out", (16384, 12288), torch.bfloat16, torch.float32, None),
]

SWEEP: dict[int, list[tuple[int, int]]] = {  # D -> [(BLOCK_R, num_warps)]
    3072: [(1, 4), (1, 8), (1, 16), (2, 8), (2, 16)],
    128: [(16, 4), (32, 4), (32, 8), (64, 4), (64, 8), (128, 8)],
    12288: [(1, 8), (1, 16), (1, 32)],
}


def bench_shape(
    name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    out_dtype: torch.dtype | None,
    sizes: list[int] | None,
    iters: int,
    sweep: bool,
    copy_tb_s: float,
) -> dict[str, Any]:
    d = shape[-1]
    m = 1 if sizes is None else len(sizes)
    x = torch.randn(shape, device="cuda").to(dtype)
    weight = torch.randn(m, 1, d, device="cuda") * 0.2
    odt = out_dtype or dtype
    nbytes = x.numel() * x.element_size() + x.numel() * odt.itemsize + weight.numel() * 4

    # Correctness guard before timing: fused vs composite within the contract's FP32 bound.
    f32 = torch.empty(shape, device="cuda")
    y = triton_rmsnorm(x, weight, eps=EPS, modality_sizes=sizes, out_dtype=out_dtype, fp32_out=f32)
    ref32 = composite(x, weight, sizes, torch.float32)
    max_err = (f32 - ref32).abs().max().item()
    exact_cast = torch.equal(y, f32.to(odt))
    del f32, ref32, y

    compiled = torch.compile(composite, fullgraph=True, dynamic=False)
    fns: dict[str, Callable[[], object]] = {
        "fused_triton": lambda: triton_rmsnorm(x, weight, eps=EPS, modality_sizes=sizes, out_dtype=out_dtype),
        "composite_eager": lambda: composite(x, weight, sizes, out_dtype),
        "composite_compiled": lambda: compiled(x, weight, sizes, out_dtype),
    }
    res = {k: summarize(v, nbytes, copy_tb_s) for k, v in time_alternating(fns, iters).items()}
    row: dict[str, Any] = {
        "name": name,
        "shape": list(shape),
        "dtype": str(dtype),
        "out_dtype": str(odt),
        "modality_sizes": sizes,
        "bytes": nbytes,
        "max_abs_err_fp32_vs_composite": max_err,
        "output_equals_fp32_cast": exact_cast,
        "tile": list(rms_mod._tile(d, x.numel() // d)),
        "results": res,
        "speedup_vs_compiled": res["composite_compiled"]["p50_ms"] / res["fused_triton"]["p50_ms"],
    }
    if sweep and d in SWEEP:
        default_tile = rms_mod._tile
        cfgs: dict[str, Callable[[], object]] = {}
        for block_r, warps in SWEEP[d]:
            cfg = (block_r, triton.next_power_of_2(d), warps)

            def run(cfg: tuple[int, int, int] = cfg) -> object:
                rms_mod._tile = lambda _d, _n: cfg  # type: ignore[assignment]
                try:
                    return triton_rmsnorm(x, weight, eps=EPS, modality_sizes=sizes, out_dtype=out_dtype)
                finally:
                    rms_mod._tile = default_tile

            cfgs[f"r{block_r}_w{warps}"] = run
        sw = time_alternating(cfgs, max(10, iters // 2))
        row["sweep"] = {k: summarize(v, nbytes, copy_tb_s)["tb_s"] for k, v in sw.items()}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json", default="benchmarks/results/rmsnorm_h200.json")
    ap.add_argument("--only", default="", help="substring filter on shape names")
    args = ap.parse_args()
    torch.manual_seed(0)
    ceilings = measure_ceilings()
    info = env_info(ceilings)
    rows: list[dict[str, Any]] = []
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    for shape in SHAPES:
        if args.only in shape[0]:
            rows.append(bench_shape(*shape, iters=args.iters, sweep=args.sweep, copy_tb_s=ceilings.copy_tb_s))
            with open(args.json, "w") as f:  # rewritten after each shape: a cut-off run keeps its rows
                json.dump({"benchmark": "rmsnorm", "env": info, "rows": rows}, f, indent=2)
    print(f"this device's copy {ceilings.copy_tb_s:.2f} TB/s, measured in this run; frac = TB/s / that copy")
    print(f"{'shape':32s} {'variant':20s} {'p50 ms':>8s} {'p10':>7s} {'p90':>7s} {'TB/s':>6s} {'frac':>5s}")
    for r in rows:
        for k, v in r["results"].items():
            print(
                f"{r['name']:32s} {k:20s} {v['p50_ms']:8.4f} {v['p10_ms']:7.4f} {v['p90_ms']:7.4f} "
                f"{v['tb_s']:6.2f} {v['frac_copy_ceiling']:5.2f}"
            )
        print(
            f"{'':32s} err {r['max_abs_err_fp32_vs_composite']:.2e} exact_cast "
            f"{r['output_equals_fp32_cast']} tile {r['tile']} sweep {r.get('sweep', {})}"
        )


if __name__ == "__main__":
    main()
