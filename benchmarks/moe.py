"""Head-routed BF16 MoE benchmark: fused Triton vs torch-native (_grouped_mm) vs eager reference.

Production-local shape (Hl=3, E=256, top-6, d=256, I=1280) at T in {512, 4096, 14601} plus the
12-head shape at 4096. Calls alternate between providers, a 512 MiB buffer is zeroed before every
call (L2 flush, outside the timed region), each call is timed with device events. `--tune` sweeps
the fused plans (kernel and tile) first; `--crossover` times fused vs native over a token ladder for the dispatch rule.
`--layers N` times N distinct layers called in turn through the public op (`m2.moe_experts`, prepared
and raw weights; eager, CUDA graph and torch.compile) against one layer repeated, with re-pack counts.
The floors (weights read once at copy speed, the useful FLOPs at matmul speed) and the fractions of them
use this device's ceilings, measured in the same run (`_common.measure_ceilings`, the file's "ceilings").

    PYTHONPATH=backends/triton/src:backends/reference/src:. python -m benchmarks.moe --out moe.json \
        --tokens 512 2048 4096 14601 --tune --stages --crossover 1 64 256 1024
    ... python -m benchmarks.moe --out moe_layers.json --tokens 4096 14601 --layers 4 --skip-12
    (magi2_core, hence pydantic, must be importable; --dry-run checks the script on CPU.)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Callable
from typing import Any

import torch
import triton
from magi2_backend_triton.moe.align import align_routes_device
from magi2_backend_triton.moe.fused import MoEState, call_problem, run_fused
from magi2_backend_triton.moe.pack import pack_w13
from magi2_backend_triton.moe.plan import choose_alignment, device_id
from magi2_backend_triton.providers import triton_moe_experts
from torch import Tensor

from benchmarks import _common
from benchmarks._moe_native import grouped_mm_moe_experts, grouped_mm_syncs_host, loop_moe_experts
from magi2_core.model.plan import Plan

D, I, E, K = 256, 1280, 256, 6  # noqa: E741  # the names of docs/operators.md §3
DEV = "cuda"


def make_inputs(tokens: int, heads: int, seed: int = 419) -> tuple[Tensor, ...]:
    g = torch.Generator(device=DEV).manual_seed(seed)
    dev = DEV
    x = torch.randn(tokens, heads, D, device=dev, generator=g).bfloat16()
    w_gate = (torch.randn(heads * E, D, I, device=dev, generator=g) / 16).bfloat16()
    w_up = (torch.randn(heads * E, D, I, device=dev, generator=g) / 16).bfloat16()
    w_down = (torch.randn(heads * E, I, D, device=dev, generator=g) / math.sqrt(I)).bfloat16()
    logits = torch.randn(heads, tokens, E, device=dev, generator=g)
    top, idx = logits.topk(K, dim=-1)
    probs = torch.softmax(top, dim=-1) * 4.9  # route_scale-sized weights, unique ids
    return x, probs.float(), idx, w_gate, w_up, w_down


def floors(tokens: int, heads: int, ceilings: _common.Ceilings | None) -> dict[str, float]:
    """The weights' bytes and the useful FLOPs of one call and, against this device's ``ceilings``, the time
    to read the weights once at copy speed and to do the FLOPs at matmul speed (no floors without ceilings:
    a dry run on the CPU)."""
    weight_bytes = heads * E * 3 * D * I * 2
    flops = 6.0 * D * I * heads * tokens * K
    out = {"weight_bytes": weight_bytes, "flops": flops}
    if ceilings is not None:
        out["weight_floor_ms"] = weight_bytes / (ceilings.copy_tb_s * 1e12) * 1e3
        out["matmul_floor_ms"] = flops / (ceilings.matmul_tflops * 1e12) * 1e3
    return out


def rel_l2(a: Tensor, b: Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def time_alternating(fns: dict[str, Callable[[], Any]], iters: int, warmup: int = 3) -> dict[str, list[float]]:
    """Device-event milliseconds per call, calls rotating, a 512 MiB buffer zeroed before each (L2 flush)."""
    return _common.time_alternating(fns, iters, warmup=warmup, device=DEV, flush_bytes=512 * 2**20)


stats = _common.stats


def _align() -> str:
    """The alignment the plan rows give this benchmark's shape in the default mode (3 heads)."""
    return choose_alignment(device_id(DEV, None), 3 * E, False)


def _two(g1: tuple[int, ...], g2: tuple[int, ...], packed: bool = True) -> Plan:
    """A two-kernel plan: per GEMM (block_m, block_n, block_k, warps, stages), GROUP_M 8."""
    tile = {"BLOCK_M": g1[0], "PACKED_W13": int(packed)}
    for g, (_, n, k, w, st) in ((1, g1), (2, g2)):
        tile |= {f"BLOCK_N{g}": n, f"BLOCK_K{g}": k, f"GROUP_M{g}": 8, f"num_warps{g}": w, f"num_stages{g}": st}
    return Plan(variant="two_kernel", tile=tile, align=_align(), why="benchmark candidate")


def table_plan(x: Tensor, idx: Tensor, wg: Tensor) -> Plan:
    """The plan the provider runs for this call (its device's plan rows)."""
    return triton_moe_experts.plan(call_problem(x, idx, wg, False))


def two_kernel_candidates(tokens: int) -> list[Plan]:
    """GEMM1/GEMM2 configs, the per-BM winners of the first H200 sweep (moe_h200_run1.json)."""
    if tokens * K / E < 40:
        return [
            _two((16, 32, 64, 4, 4), (16, 64, 64, 4, 4), packed=False),
            _two((32, 64, 128, 4, 2), (32, 128, 128, 8, 2), packed=False),
            _two((64, 32, 64, 4, 4), (64, 128, 64, 4, 3)),
        ]
    return [
        _two((64, 128, 32, 4, 4), (64, 128, 64, 4, 3), packed=False),
        _two((64, 64, 64, 4, 3), (64, 256, 64, 8, 3)),
        _two((128, 128, 32, 8, 4), (128, 256, 64, 8, 3)),
    ]


def single_candidates(tokens: int) -> list[Plan]:
    """One-kernel configs: (block_m, intermediate slice, warps, stages, bank) with bank 0 = w_gate/w_up
    as given, 1 = packed with two dots, 2 = packed with one interleaved dot."""
    cfgs = (
        [
            (16, 32, 4, 4, 1),
            (16, 32, 4, 4, 2),
            (16, 16, 4, 4, 2),
            (32, 32, 4, 3, 1),
            (32, 32, 4, 3, 2),
            (16, 64, 4, 2, 2),
        ]
        if tokens * K / E < 40
        else [
            (128, 32, 8, 3, 1),
            (128, 32, 8, 3, 0),
            (128, 32, 8, 3, 2),
            (128, 16, 8, 4, 2),
            (64, 64, 4, 2, 2),
            (64, 32, 4, 3, 2),
            (32, 32, 4, 3, 1),
        ]
    )
    return [
        Plan(
            variant="one_kernel",
            tile={
                "BLOCK_M": bm,
                "BLOCK_I": bi,
                "num_warps": w,
                "num_stages": st,
                "PACKED_W13": int(b > 0),
                "INTERLEAVED": int(b == 2),
            },
            align=_align(),
            why="benchmark candidate",
        )
        for bm, bi, w, st, b in cfgs
    ]


def tune(tokens: int, heads: int, iters: int) -> dict[str, Any]:
    x, probs, idx, wg, wu, wd = make_inputs(tokens, heads)
    state = MoEState()
    rows: list[dict[str, Any]] = []
    for plan in single_candidates(tokens) + two_kernel_candidates(tokens)[:1]:
        try:
            fn = functools.partial(run_fused, x, probs, idx, wg, wu, wd, state=state, plan=plan)
            ms = stats(time_alternating({"f": fn}, iters)["f"])["p50"]
        except Exception as e:  # an illegal config (shared memory) is a data point
            rows.append({"tiles": plan.model_dump(), "error": repr(e)[:300]})
            continue
        rows.append({"tiles": plan.model_dump(), "p50_ms": ms})
    ok = [r for r in rows if "p50_ms" in r]
    one = [r for r in ok if r["tiles"]["variant"] != "two_kernel"]
    best = {
        "single": min(one, key=lambda r: r["p50_ms"], default=None),
        "two_kernel": min((r for r in ok if r not in one), key=lambda r: r["p50_ms"], default=None),
    }
    return {"tokens": tokens, "heads": heads, "sweep": rows, "combined": {k: v for k, v in best.items() if v}}


def stage_times(tokens: int, heads: int, tiles: Plan | None, iters: int) -> dict[str, Any]:
    """Where the time goes: the route alignment alone, the whole call eager, and the whole call
    replayed from a CUDA graph (GPU time without Python launch gaps); L2 flushed before each."""
    x, probs, idx, wg, wu, wd = make_inputs(tokens, heads)
    state = MoEState()
    t = tiles or table_plan(x, idx, wg)
    call = functools.partial(run_fused, x, probs, idx, wg, wu, wd, state=state, plan=t)
    call()
    bufs = state.route_buffers(heads * tokens * K, heads * E, t.tile["BLOCK_M"], x.device)
    fns: dict[str, Callable[[], Any]] = {"align": functools.partial(align_routes_device, idx, E, bufs), "eager": call}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    fns["graph"] = graph.replay
    res = {k: stats(v)["p50"] for k, v in time_alternating(fns, iters).items()}
    return {"tokens": tokens, "heads": heads, "tiles": t.model_dump(), **res}


def check(tokens: int, heads: int, state: MoEState, seed: int, tiles: Plan | None = None) -> dict[str, Any]:
    x, probs, idx, wg, wu, wd = make_inputs(tokens, heads, seed)
    ref = loop_moe_experts(x, probs, idx, wg, wu, wd)
    y = run_fused(x, probs, idx, wg, wu, wd, state=state, plan=tiles).y
    nat = grouped_mm_moe_experts(x, probs, idx, wg, wu, wd)
    return {
        "tokens": tokens,
        "heads": heads,
        "seed": seed,
        "fused_rel_l2": rel_l2(y, ref),
        "fused_finite": bool(torch.isfinite(y).all()),
        "fused_max_abs": float((y.float() - ref.float()).abs().max()),
        "native_rel_l2": rel_l2(nat, ref),
        "single_kernel": tiles is not None and tiles.variant != "two_kernel",
    }


def _graphed(fn: Callable[[], Any]) -> tuple[Callable[[], Any] | None, str | None]:
    """``fn`` captured in a CUDA graph, or why it cannot be (e.g. a host sync inside)."""
    if DEV != "cuda":
        return fn, None
    try:
        return _common.graphed(fn), None
    except Exception as e:  # recorded in the results, never hidden
        torch.cuda.synchronize()
        return None, f"{type(e).__name__}: {str(e)[:300]}"


def bench(
    tokens: int, heads: int, iters: int, eager_iters: int, tiles: Plan | None, ceilings: _common.Ceilings | None
) -> dict[str, Any]:
    """The plan's fused kernel against the previous kernel (the same tile through the `one_kernel`
    variant, the one-kernel path before the Hopper variants) and torch's `_grouped_mm` pipeline, each
    eager and replayed from a CUDA graph, in one run on the same inputs. The fused calls read the
    prepared-weight layout (views of one packed bank, as `m2.prepare_moe_weights` makes), so the graph
    holds the same kernel as the eager call. Keys "fused" and "native" are the eager times (as in
    earlier files); "<name>_graph" the graph replays."""
    x, probs, idx, wg, wu, wd = make_inputs(tokens, heads)
    bank = pack_w13(wg, wu)
    gate, up = bank[:, 0::2, :].transpose(1, 2), bank[:, 1::2, :].transpose(1, 2)
    table = tiles or table_plan(x, idx, wg)
    base_align = choose_alignment(device_id(DEV, None), heads * E, False) if table.align == "lists" else table.align
    previous = (
        table
        if table.variant == "two_kernel"
        else table.model_copy(
            update={
                "variant": "one_kernel",
                "align": base_align,
                "why": "the plan's tile through the `one_kernel` variant",
            }
        )
    )
    state, prev_state = MoEState(), MoEState()
    fns: dict[str, Callable[[], Any]] = {
        "fused": functools.partial(run_fused, x, probs, idx, gate, up, wd, state=state, plan=table),
        "previous": functools.partial(run_fused, x, probs, idx, gate, up, wd, state=prev_state, plan=previous),
        "native": functools.partial(grouped_mm_moe_experts, x, probs, idx, wg, wu, wd),
    }
    y = fns["fused"]().y
    y_prev = fns["previous"]().y
    ref = loop_moe_experts(x, probs, idx, wg, wu, wd)
    graphs: dict[str, Callable[[], Any]] = {}
    errors: dict[str, str] = {}
    for name, fn in fns.items():
        if name == "native" and grouped_mm_syncs_host(heads * E):  # a failed capture can poison the context
            errors[name] = f"not capturable: {heads * E} experts run in chunks with a host sync"
            continue
        g, why = _graphed(fn)
        if g is None:
            errors[name] = why or "?"
        else:
            graphs[name + "_graph"] = g
    samples = time_alternating(fns, iters)
    samples.update(time_alternating(graphs, iters))
    if eager_iters:
        eager = functools.partial(loop_moe_experts, x, probs, idx, wg, wu, wd)
        samples.update(time_alternating({"eager": eager}, eager_iters, warmup=1))
    fl = floors(tokens, heads, ceilings)
    res: dict[str, Any] = {"tokens": tokens, "heads": heads, **fl}
    for name, smp in samples.items():
        st = stats(smp)
        if ceilings is not None:
            st["weight_floor_fraction"] = fl["weight_floor_ms"] / st["p50"]
            st["matmul_fraction"] = fl["matmul_floor_ms"] / st["p50"]
        st["tflops"] = fl["flops"] / (st["p50"] * 1e-3) / 1e12
        res[name] = st
    res["graph_errors"] = errors
    res["speedup_vs_native_p50"] = res["native"]["p50"] / res["fused"]["p50"]
    if "fused_graph" in res:
        res["fused_eager_over_graph"] = res["fused"]["p50"] / res["fused_graph"]["p50"]
        res["previous_graph_over_fused_graph"] = res["previous_graph"]["p50"] / res["fused_graph"]["p50"]
    res["fused_rel_l2"] = rel_l2(y, ref)
    res["previous_rel_l2"] = rel_l2(y_prev, ref)
    res["fused_bit_equal_previous"] = bool(torch.equal(y, y_prev))
    res["tiles"] = table.model_dump()
    res["previous_tiles"] = previous.model_dump()
    return res


def layers_in_turn(tokens: int, heads: int, layers: int, iters: int) -> dict[str, Any]:
    """ms per MoE call when ``layers`` distinct layers run in turn through ``m2.moe_experts``."""
    import magi2_core as m2

    x, probs, idx, *_ = make_inputs(tokens, heads)
    raw = [make_inputs(tokens, heads, seed=1000 + n)[3:] for n in range(layers)]
    prepared = [m2.prepare_moe_weights(*w) for w in raw]
    provider = m2.resolve("moe_experts", x, probs, idx, prepared[0]).chosen

    def one_pass(weights: list[Any], det: bool = False) -> Callable[[], Any]:
        def run() -> Any:
            # Each layer consumes the previous one's output, as in a model: a compiler may drop calls
            # whose results nobody reads (inductor did, when every layer read the same x).
            h = x
            for w in weights:
                h = m2.moe_experts(h, probs, idx, *(w if isinstance(w, tuple) else (w,)), deterministic=det)
            return h

        return run

    fns: dict[str, Callable[[], Any]] = {
        "one_layer_repeated": one_pass([prepared[0]] * layers),
        "prepared_in_turn": one_pass(prepared),
        "raw_in_turn": one_pass([tuple(w) for w in raw]),
        "prepared_in_turn_deterministic": one_pass(prepared, det=True),
    }
    if DEV == "cuda":
        for name in ("prepared_in_turn", "raw_in_turn"):
            fns[name + "_graph"] = _common.graphed(fns[name])
        compiled = torch.compile(fns["prepared_in_turn"], fullgraph=True)
        fns["prepared_in_turn_compiled"] = compiled
    for fn in fns.values():
        fn()  # first pass: compiles (raw layers are read in place, never packed)
    pack_count = _common.pack_counter()
    assert pack_count is not None
    packs0 = pack_count()
    samples = time_alternating(fns, iters)
    res: dict[str, Any] = {
        "tokens": tokens,
        "heads": heads,
        "layers": layers,
        "provider": provider,
        "repacks_after_first_pass": pack_count() - packs0,
        "bytes_per_layer": {
            "raw_tensors": sum(t.nbytes for t in raw[0]),
            "raw_plus_cached_bank": sum(t.nbytes for t in raw[0]) + 2 * raw[0][0].nbytes,
            "prepared": prepared[0].nbytes,
        },
    }
    for name, s in samples.items():
        res[name] = stats([v / layers for v in s])
    base = res["prepared_in_turn"]["p50"]
    res["deterministic_over_default"] = res["prepared_in_turn_deterministic"]["p50"] / base
    res["in_turn_over_repeated"] = base / res["one_layer_repeated"]["p50"]
    return res


def crossover(heads: int, ladder: list[int], iters: int) -> list[dict[str, Any]]:
    out = []
    for t in ladder:
        args = make_inputs(t, heads)
        state = MoEState()
        s = time_alternating(
            {
                "fused": lambda a=args, st=state: run_fused(*a, state=st),
                "native": lambda a=args: grouped_mm_moe_experts(*a),
            },
            iters,
        )
        out.append(
            {
                "tokens": t,
                "fused_p50": stats(s["fused"])["p50"],
                "native_p50": stats(s["native"])["p50"],
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", type=int, nargs="*", default=[512, 4096, 14601])
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--eager-iters", type=int, default=3)
    p.add_argument("--tune", action="store_true")
    p.add_argument("--tune-iters", type=int, default=8)
    p.add_argument("--crossover", type=int, nargs="*", default=[])
    p.add_argument("--skip-12", action="store_true")
    p.add_argument("--stages", action="store_true")
    p.add_argument("--layers", type=int, default=0, help="also time N distinct layers called in turn")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="tiny shapes on CPU under TRITON_INTERPRET=1",
    )
    a = p.parse_args()
    if a.dry_run:
        global D, I, E, DEV  # noqa: E741
        D, I, E, DEV = 32, 48, 8, "cpu"  # noqa: E741
    cuda = DEV == "cuda"
    ceilings = _common.measure_ceilings(DEV) if cuda else None  # the CPU (a dry run) has none: no fractions
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "ceilings": ceilings.record() if ceilings else None,
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count if cuda else 0,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "commit": _common.git_commit(),
        "shape": {"d": D, "I": I, "E": E, "K": K},
        "method": "device events per call; calls alternate; 512 MiB zeroed before each call",
    }

    def dump() -> None:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)

    if a.tune:
        report["tune"] = []
        for t in a.tokens:
            report["tune"].append(tune(t, 3, a.tune_iters))
            dump()
            for k, v in report["tune"][-1]["combined"].items():
                print(f"tune T={t} {k}: {v['p50_ms']:.3f} ms {v['tiles']}", flush=True)
    best: dict[int, Plan] = {}
    for r in report.get("tune", []):
        top = min(r["combined"].values(), key=lambda c: c["p50_ms"])
        best[r["tokens"]] = Plan.model_validate(top["tiles"])
    if a.stages and cuda:
        report["stages"] = [stage_times(t, 3, best.get(t), 15) for t in a.tokens]
        for r in report["stages"]:
            print("stages", {k: r[k] for k in ("tokens", "align", "eager", "graph")}, flush=True)
        dump()
    st = MoEState()
    big = 4096 if cuda else 9
    cases = [(1, 3, 1), (129, 3, 2), (big, 3, 419), (big, 3, 420)]
    report["checks"] = [check(t, h, st, s) for t, h, s in cases]
    report["checks"] += [check(t, h, st, s, tl_) for t, h, s in cases for tl_ in best.values()]
    for c in report["checks"]:
        print("check", c, flush=True)
    dump()
    report["bench"] = []
    shapes = [(t, 3) for t in a.tokens] + ([] if a.skip_12 else [(4096, 12)])
    for t, h in shapes:
        report["bench"].append(bench(t, h, a.iters, a.eager_iters, best.get(t), ceilings))
        dump()
    if a.crossover:
        report["crossover"] = crossover(3, a.crossover, 15)
        dump()
    if a.layers:
        report["layers_in_turn"] = []
        for t in a.tokens:
            report["layers_in_turn"].append(layers_in_turn(t, 3, a.layers, a.iters))
            dump()
    if ceilings:
        print(
            f"this device's ceilings, measured in this run: copy {ceilings.copy_tb_s:.2f} TB/s, matmul "
            f"{ceilings.matmul_tflops:.0f} TFLOP/s; matmul% / wfloor% = the useful FLOPs at this device's matmul "
            "rate / the weights read once at this device's copy rate, over the p50"
        )
    else:
        print("no device ceilings on the CPU: matmul% and wfloor% left out")
    print(f"{'T':>6} {'Hl':>3} {'':>9} {'fused':>7} {'p10-p90':>13} {'previous':>8} {'native':>8}  matmul% wfloor%")
    for r in report["bench"]:
        for mode, suffix in (("eager", ""), ("graph", "_graph")):
            f = r.get("fused" + suffix)
            if f is None:
                continue
            prev = r.get("previous" + suffix, {}).get("p50", float("nan"))
            nat = r.get("native" + suffix, {}).get("p50", float("nan"))
            print(
                f"{r['tokens']:>6} {r['heads']:>3} {mode:>9} {f['p50']:>7.3f} {f['p10']:>6.3f}-{f['p90']:<6.3f} "
                f"{prev:>8.3f} {nat:>8.3f}  {100 * f.get('matmul_fraction', math.nan):>6.1f} "
                f"{100 * f.get('weight_floor_fraction', math.nan):>6.1f}"
            )
        print(
            f"{'':>10} rel-L2 {r['fused_rel_l2']:.2e}, bit-equal previous: {r['fused_bit_equal_previous']}, "
            f"graph errors: {r['graph_errors'] or 'none'}"
        )
    for c in report.get("crossover", []):
        print(f"crossover T={c['tokens']}: fused {c['fused_p50']:.3f} native {c['native_p50']:.3f}")
    for r in report.get("layers_in_turn", []):
        modes = " ".join(f"{k} {v['p50']:.3f}" for k, v in r.items() if isinstance(v, dict) and "p50" in v)
        print(
            f"layers T={r['tokens']} x{r['layers']} ({r['provider']}), ms per call: {modes}; "
            f"re-packs after first pass {r['repacks_after_first_pass']}; bytes/layer {r['bytes_per_layer']}"
        )


if __name__ == "__main__":
    main()
