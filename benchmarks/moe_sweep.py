"""One-shot sweep of the fused-MoE kernel variants (tiles.VARIANTS) against the plan's kernel.

For each shape (production-local Hl=3, E=256, top-6, d=256, I=1280 at T=4096, 14601, 512, then
12 heads at 4096), on one set of fresh random inputs:

1. check: the plan's kernel ("base") and every variant run once; a compile or launch error is
   recorded for that variant (and it is skipped at later shapes), never raised. Each output is
   compared with the base (bit equality, max |diff|, rel-L2) and with the FP32-reduced schedule
   (`loop_moe_experts`); a variant is correct when finite and bit-equal to the base or within
   rel-L2 3e-4 of the reference.
2. time: every correct variant and the base, each captured in its own CUDA graph, replayed in
   rotating order with a 512 MiB buffer zeroed before each call (L2 flush), device events per call:
   p50 and p10-p90; eager p50 through `run_fused` too.
3. report: JSON (device, versions, commit, this device's ceilings, per-shape checks and timings) and a
   table with the fraction of this device's matmul ceiling (useful FLOPs) and of its weight-read floor,
   both from the ceilings measured in the same run (`_common.measure_ceilings`; none in a CPU dry run).

Prepared-weight layout throughout (gate/up as views of one packed bank, as `prepare_moe_weights`
gives the kernels), so no variant pays for or caches a pack. Two passes: the variants without warp
specialisation first, then the warp-specialised ones (the newest compiler path: if it crashes the
process, the first pass is already written). JSON is rewritten after every shape. Past
``--budget-s`` seconds the remaining shapes are skipped (recorded as such).

    PYTHONPATH=backends/triton/src:backends/reference/src:. python -m benchmarks.moe_sweep
    ... python -m benchmarks.moe_sweep --dry-run   # CPU, TRITON_INTERPRET=1, tiny shapes
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from benchmarks._common import Ceilings

SHAPES = [(4096, 3), (14601, 3), (512, 3), (4096, 12)]
REL_L2_LIMIT = 3e-4


def candidates(base: Any, variants: list[str], align: str) -> dict[str, Any]:
    """The plan ("base") and, for each variant, the base's one-kernel tile with that kernel; where the
    base holds few rows, also a 2-stage TMA tile and a 64-wide-slice TMA tile; where it holds 128 rows,
    TMA tiles with 2 and 4 stages, with 64-wide intermediate slices and with 64-row blocks. The Gluon
    kernel runs with 64-row blocks where the base's are smaller, and with both 128 and 64 where they
    are 128. ``align``: the alignment of the aligned kernels (the per-expert kernel reads route lists).
    (The warp-specialised and persistent TMA schedules this sweep once timed gave no gain and left the
    package, docs/moe-notes.md; git history keeps them.)"""
    from magi2_core.model.plan import Plan

    out = {"base": base}
    if base.variant == "two_kernel":
        return out

    def plan(variant: str, **over: int) -> Any:
        return Plan(
            variant=variant,
            tile=base.tile | over,
            align="lists" if variant == "gluon_routed" else align,
            why="sweep candidate",
        )

    rows = base.tile["BLOCK_M"]
    for v in variants:
        if v != "gluon_ws" or rows == 128:  # two 64-row consumers per block
            out[v] = plan(v)
    m64 = {"BLOCK_M": 64, "num_warps": 4, "num_stages": 3}  # the wgmma kernel: 64 or 128 rows, a warp per 16
    if "gluon" in variants:
        out["gluon" if rows < 64 else "gluon_m64"] = plan("gluon", **m64)
        # 16-wide slices at 64 rows: ~90 KB of shared memory and < 200 registers, so two programs
        # share an SM and each one's SwiGLU7 can run under the other's MMAs.
        out["gluon_m64_i16"] = plan("gluon", **m64, BLOCK_I=16)
    if "gluon_routed" in variants and rows == 128:
        # One program per expert: 64-row blocks where an expert's ~100 routes would pad a 128-row one.
        out["gluon_routed_m64"] = plan("gluon_routed", **m64)
    if rows <= 32:
        # 2 stages halve the shared memory of the 16-row tile (~104 KB): two programs fit per SM.
        if "tma" in variants:
            out["tma_s2"] = plan("tma", num_stages=2)
            # weight-stream bound: 64-wide slices move twice the bytes per pipeline step (2 x 96 KB)
            out["tma_i64_s2"] = plan("tma", BLOCK_I=64, num_stages=2)
    elif "tma" in variants:
        # 128-row tiles: the pipeline depth and the slice width of the TMA kernel (stages x slice
        # bytes share the ~228 KB of shared memory with the 64 KB activation tile), and 64-row
        # blocks (half the padding and the matrix work per block; an expert's weights then stream
        # through twice the programs, mostly from L2 since its blocks run side by side).
        for name, over in (
            ("tma_s2", {"num_stages": 2}),
            ("tma_s4", {"num_stages": 4}),
            ("tma_i64_s2", {"BLOCK_I": 64, "num_stages": 2}),
            ("tma_m64_w4", {"BLOCK_M": 64, "num_warps": 4}),
            ("tma_m64_w8", {"BLOCK_M": 64, "num_warps": 8}),
        ):
            out[name] = plan("tma", **over)
    return out


def _short_error(e: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(e), e)).strip()
    return text[-1500:]


def sweep_shape(
    bm: Any,
    tokens: int,
    heads: int,
    variants: list[str],
    failed: dict[str, str],
    iters: int,
    progress: Callable[[str], None],
    ceilings: Ceilings | None,
) -> dict[str, Any]:
    from magi2_backend_triton.moe.fused import MoEState, call_problem, run_fused
    from magi2_backend_triton.moe.pack import pack_w13
    from magi2_backend_triton.moe.plan import choose_alignment, device_id
    from magi2_backend_triton.providers import triton_moe_experts

    from benchmarks._moe_native import loop_moe_experts

    cuda = bm.DEV == "cuda"
    x, probs, idx, wg, wu, wd = bm.make_inputs(tokens, heads, seed=7000 + tokens + heads)
    bank = pack_w13(wg, wu)
    del wg, wu
    gate, up = bank[:, 0::2, :].transpose(1, 2), bank[:, 1::2, :].transpose(1, 2)  # prepared views
    base = triton_moe_experts.plan(call_problem(x, idx, gate, False))
    cands = candidates(base, variants, choose_alignment(device_id(bm.DEV, None), heads * bm.E, False))
    res: dict[str, Any] = {"tokens": tokens, "heads": heads, **bm.floors(tokens, heads, ceilings), "variants": {}}
    ref = loop_moe_experts(x, probs, idx, gate, up, wd)
    outs: dict[str, Tensor] = {}
    calls: dict[str, Callable[[], Any]] = {}
    for name, tiles in cands.items():
        rec: dict[str, Any] = {"tiles": tiles.model_dump()}
        res["variants"][name] = rec
        if name in failed:
            rec["skipped"] = f"failed earlier: {failed[name][:200]}"
            continue
        state = MoEState()
        progress(name)  # on disk before the compile: a crash that kills the process names its variant
        try:
            t0 = time.perf_counter()
            y = run_fused(x, probs, idx, gate, up, wd, state=state, plan=tiles).y
            if cuda:
                torch.cuda.synchronize()
            rec["first_call_s"] = time.perf_counter() - t0  # includes the compile
        except Exception as e:  # a variant that does not compile is a result, not a crash
            rec["error"] = _short_error(e)
            failed[name] = rec["error"]
            print(f"  T={tokens} Hl={heads} {name}: ERROR {rec['error'].splitlines()[-1][:200]}", flush=True)
            continue
        outs[name] = y
        rec["finite"] = bool(torch.isfinite(y).all())
        rec["rel_l2_vs_ref"] = bm.rel_l2(y, ref)
        calls[name] = functools.partial(run_fused, x, probs, idx, gate, up, wd, state=state, plan=tiles)
    base_y = outs.get("base")
    for name, y in outs.items():
        rec = res["variants"][name]
        if base_y is not None:
            rec["bit_equal_base"] = bool(torch.equal(y, base_y))
            rec["max_abs_vs_base"] = float((y.float() - base_y.float()).abs().max())
            rec["rel_l2_vs_base"] = bm.rel_l2(y, base_y)
        rec["correct"] = rec["finite"] and (rec.get("bit_equal_base", False) or rec["rel_l2_vs_ref"] <= REL_L2_LIMIT)
        if not rec["correct"]:
            failed.setdefault(name, f"incorrect at T={tokens} Hl={heads}: rel-L2 {rec['rel_l2_vs_ref']:.3g}")
    del ref, outs
    from benchmarks._common import graphed  # imported late, like the rest of the benchmark's torch-side modules

    timed = {n: c for n, c in calls.items() if res["variants"][n]["correct"]}
    fns: dict[str, Callable[[], Any]] = {}
    for name, call in timed.items():
        try:
            fns[name + "/graph"] = graphed(call) if cuda else call
        except Exception as e:  # capture can fail where eager works: record, keep sweeping
            res["variants"][name]["graph_error"] = _short_error(e)
        fns[name + "/eager"] = call
    samples = bm.time_alternating(fns, iters)
    for key, s in samples.items():
        name, mode = key.split("/")
        st = bm.stats(s)
        if ceilings is not None:
            st["matmul_ceiling_fraction"] = res["matmul_floor_ms"] / st["p50"]
            st["weight_floor_fraction"] = res["weight_floor_ms"] / st["p50"]
        st["useful_tflops"] = res["flops"] / (st["p50"] * 1e-3) / 1e12
        res["variants"][name][mode] = st
    graphs = {n: r["graph"]["p50"] for n, r in res["variants"].items() if "graph" in r}
    if graphs:
        res["fastest_graph"] = min(graphs, key=lambda n: graphs[n])
        if "base" in graphs:
            for n, p in graphs.items():
                res["variants"][n]["graph_speedup_vs_base"] = graphs["base"] / p
    return res


def print_table(report: dict[str, Any]) -> None:
    print(
        f"\n{'T':>6} {'Hl':>3} {'variant':<20} {'graph p50':>9} {'p10-p90':>15} {'eager p50':>9} "
        f"{'x base':>6} {'matmul%':>7} {'wfloor%':>7}  check"
    )
    for r in report["shapes"]:
        for name, v in r.get("variants", {}).items():
            if "error" in v or "skipped" in v:
                why = v.get("error", v.get("skipped", "")).splitlines()[-1][:60]
                print(
                    f"{r['tokens']:>6} {r['heads']:>3} {name:<20} {'-':>9} {'':>15} {'-':>9} {'':>6} "
                    f"{'':>7} {'':>7}  {why}"
                )
                continue
            g, e = v.get("graph"), v.get("eager")
            chk = ("bit-equal" if v.get("bit_equal_base") else f"relL2 {v['rel_l2_vs_ref']:.2e}") + (
                "" if v["correct"] else " WRONG"
            )
            gp = f"{g['p50']:9.3f}" if g else f"{'-':>9}"
            spread = f"{g['p10']:.3f}-{g['p90']:.3f}" if g else ""
            ep = f"{e['p50']:9.3f}" if e else f"{'-':>9}"
            sp = f"{v['graph_speedup_vs_base']:6.2f}" if "graph_speedup_vs_base" in v else f"{'':>6}"
            mm = f"{100 * g['matmul_ceiling_fraction']:6.1f}%" if g and "matmul_ceiling_fraction" in g else f"{'':>7}"
            wf = f"{100 * g['weight_floor_fraction']:6.1f}%" if g and "weight_floor_fraction" in g else f"{'':>7}"
            print(f"{r['tokens']:>6} {r['heads']:>3} {name:<20} {gp} {spread:>15} {ep} {sp} {mm} {wf}  {chk}")
    c = report.get("ceilings")
    if c:
        print(
            f"matmul% = useful-FLOP time at this device's matmul ({c['matmul_tflops']:.0f} TFLOP/s) / p50; wfloor% = "
            f"weight-read time at this device's copy ({c['copy_tb_s']:.2f} TB/s) / p50; both measured in this run"
        )
    else:
        print("no device ceilings on the CPU: matmul% and wfloor% left out")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/moe_sweep_h200.json")
    p.add_argument("--variants", nargs="*", help="tiles.VARIANTS one-kernel values (default: all but one_kernel)")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--shapes", nargs="*", help="TOKENSxHEADS each (default: 4096x3 14601x3 512x3 4096x12)")
    p.add_argument("--budget-s", type=float, default=180.0, help="start no new shape after this many seconds")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1")
    a = p.parse_args()
    if a.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before the first Triton import
    from magi2_backend_triton.moe.tiles import ONE_KERNEL

    from benchmarks import _common
    from benchmarks import moe as bm

    variants = a.variants if a.variants is not None else [v for v in ONE_KERNEL if v != "one_kernel"]

    shapes = [tuple(int(v) for v in sh.split("x")) for sh in a.shapes] if a.shapes else SHAPES
    if a.dry_run:
        bm.D, bm.I, bm.E, bm.DEV = 32, 64, 8, "cpu"
        shapes, a.iters = (shapes if a.shapes else [(9, 2)]), 1
    ceilings = _common.measure_ceilings(bm.DEV) if bm.DEV == "cuda" else None  # none on the CPU: no fractions
    started = time.perf_counter()
    report: dict[str, Any] = {
        **_common.env_record(bm.DEV),
        "ceilings": ceilings.record() if ceilings else None,
        "shape": {"d": bm.D, "I": bm.I, "E": bm.E, "K": bm.K},
        "method": "one CUDA graph per call replayed, calls rotating, 512 MiB zeroed before each (L2 flush), "
        "device events; prepared-weight layout; correctness on the same fresh inputs",
        "rel_l2_limit": REL_L2_LIMIT,
        "shapes": [],
    }
    failed: dict[str, str] = {}
    # Pass 1: the variants without warp specialisation. Pass 2: the warp-specialised ones, whose
    # compiler path (Triton's Hopper warp-spec pass) is the newest: should it bring the process
    # down, pass 1's results are already on disk. Each pass times the base again (same-run ratios).
    passes = [[v for v in variants if not v.endswith("_ws")], [v for v in variants if v.endswith("_ws")]]
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)

    def dump() -> None:
        report["wall_s"] = time.perf_counter() - started
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)

    def progress(tokens: int, heads: int) -> Callable[[str], None]:
        def mark(variant: str) -> None:
            report["in_progress"] = {"tokens": tokens, "heads": heads, "first_call_of": variant}
            dump()

        return mark

    for group in (g for g in passes if g):
        for tokens, heads in shapes:
            elapsed = time.perf_counter() - started
            if elapsed > a.budget_s:
                print(f"T={tokens} Hl={heads} {group}: skipped (budget {a.budget_s:.0f} s spent)", flush=True)
                report["shapes"].append({"tokens": tokens, "heads": heads, "skipped_for_budget": group})
                continue
            print(f"T={tokens} Hl={heads} {group} (t={elapsed:.0f}s)", flush=True)
            report["shapes"].append(
                sweep_shape(bm, tokens, heads, group, failed, a.iters, progress(tokens, heads), ceilings)
            )
            report.pop("in_progress", None)
            dump()
            if bm.DEV == "cuda":
                torch.cuda.empty_cache()
    print_table(report)
    print(f"wrote {a.out} in {report['wall_s']:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
