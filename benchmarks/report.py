"""Summarise benchmarks/results/*.json: README's headline table, docs/benchmarks.md and its plots.

    python -m benchmarks.report            # rewrite the README table, docs/benchmarks.md, docs/img/*.svg
    python -m benchmarks.report --check    # exit 1 if README's table differs from the JSON (CI test)

The tables need only the standard library; the plots need matplotlib (``nox -s report`` installs it).
The README holds a headline table of at most 8 rows (``HEADLINES``: one result per operator, the
vllm-omni layers, the dispatch cost, and a whole DiT step once ``dit_step_<device>.json`` exists),
each line at most 100 columns. docs/benchmarks.md holds the full table of current results: the
newest run of each benchmark, and one verdict per target (the MoE speed targets are judged on the
newest `benchmarks/moe.py` run, the dispatch target on the serving path). Sweeps of kernels that have
since been replaced are history: docs/benchmarks.md keeps their rows, CHANGELOG.md what they decided.
A file that was superseded by a later run is listed with the run that replaced it; a file nobody
taught this script about is skipped with a note, never an error, so new results can land before
their summariser does.

Fractions of a ceiling ("of copy", "of the matmul ceiling", "of the weight floor") divide by the ceilings
of the device the file was measured on (:func:`file_ceilings`): the ones it recorded, measured in its own
run; for an older file without them, the H200's constants that its benchmark divided by, if it was
measured on the H200; else none, and its rows say so instead of giving a fraction.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
DOC = ROOT / "docs" / "benchmarks.md"
IMG = ROOT / "docs" / "img"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"

Row = tuple[str, str, str, str, str]
Data = dict[str, Any]

# Earlier runs kept for the record; the file named replaces each in the table.
SUPERSEDED = {
    "attention_h200.json": "attention_h200_final.json",
    "attention_h200_run1.json": "attention_h200_final.json",
    "attention_h200_rule2048x2048.json": "attention_h200_final.json",
    "dit_step_h100_503129a.json": "dit_step_h100.json",
    "dit_step_h100_a2f2be0.json": "dit_step_h100.json",  # vllm-omni's own mHC; the current file swaps in ours
    "moe_h200_run1.json": "moe_h200_954e8b5.json",
    "moe_h200_run2.json": "moe_h200_954e8b5.json",
    "moe_h200_run3.json": "moe_h200_954e8b5.json",
    "distributed_tiny_h200x2.json": "distributed_h200x2.json",
    "route_profile_h200_3d65876.json": "route_profile_h200.json",
    "route_fused_h200_4556481.json": "route_fused_h200_589d461.json",
    "route_fused_h200_fd0a424.json": "route_fused_h200_589d461.json",
    # the selection's variants measured on the way (docs/moe-notes.md, "the fused router")
    "route_fused_h200_e486a01.json": "route_fused_h200_589d461.json",
    "route_fused_h200_51f95b1.json": "route_fused_h200_589d461.json",
    "route_fused_h200_93349d4.json": "route_fused_h200_589d461.json",
    # the Gluon kernel's first sweep, before its wgmmas stopped being serialized (docs/moe-notes.md)
    "moe_sweep_gluon_serialized_h200.json": "moe_sweep_gluon_h200.json",
    # the same benchmarks at 954e8b5 (the Gluon kernel in the table); the earlier files keep the
    # tile sweep, the T = 2048 point and the fused-vs-native crossover the rules cite
    "moe_h200.json": "moe_h200_cabdec4.json",
    "moe_layers_h200.json": "moe_layers_h200_73cdf12.json",
    # the final commits: 73cdf12 (the warp-specialised kernel in the table), then cabdec4 (the stable
    # alignment kernels); the 4-layer JSON of cabdec4 did not come back from the device (over the
    # 8-file limit of a call), its log does: logs/h200_moe_layers_cabdec4.log
    "moe_h200_954e8b5.json": "moe_h200_cabdec4.json",
    "moe_h200_73cdf12.json": "moe_h200_cabdec4.json",
    "moe_layers_h200_954e8b5.json": "moe_layers_h200_73cdf12.json",
    "moe_align_h200.json": "moe_align_h200_cabdec4.json",
    # the warp-specialised kernel before it was persistent (docs/moe-notes.md keeps its numbers)
    "moe_sweep_ws_h200.json": "moe_sweep_ws_persistent_h200.json",
    # the H100 before its ceilings were measured in the same run (e6abbd8), and the step and mHC
    # with the FP32 logits kernel (0943b32); docs/benchmarks.md keeps their numbers
    "attention_h100_e6abbd8.json": "attention_h100.json",
    "moe_h100_e6abbd8.json": "moe_h100.json",
    "mhc_h100_0943b32.json": "mhc_h100.json",
    "dit_step_h100_0943b32.json": "dit_step_h100.json",
    # mHC before the split-BF16 logits kernel served every modality in one launch (9f7124f)
    "mhc_h100_740693e.json": "mhc_h100.json",
    "mhc_sweep_h100_2337ac0.json": "mhc_sweep_h100.json",
    # before qk_norm_rope (740693e: with graph and fidelity; ed501e5: the layer stack), and the step at
    # e886b01 without graph or fidelity; docs/benchmarks.md keeps their numbers
    "dit_step_h100_740693e.json": "dit_step_h100.json",
    "dit_step_h100_e886b01.json": "dit_step_h100.json",
    # the step at 822c45d (compiled only), measured again at f748040 in every mode
    "dit_step_h100_822c45d.json": "dit_step_h100.json",
    "vllm_omni_stack_h100_ed501e5.json": "vllm_omni_stack_h100.json",
    # the output gate's first run (677e54f, no dynamic-shape baseline) and the host-CPU dispatch at 9456316
    "output_gate_h100_677e54f.json": "output_gate_h100.json",
    "dispatch_cpu_h100host_9456316.json": "dispatch_cpu_h100host.json",
    # 915066e's runs on an H100 (the op specs as one constructor each); docs/benchmarks.md keeps the
    # numbers before: mHC at 9f7124f, the layer at e886b01, dispatch at 822c45d (whose q/k row timed an index)
    "mhc_h100_9f7124f.json": "mhc_h100.json",
    "vllm_omni_stack_h100_e886b01.json": "vllm_omni_stack_h100.json",
    "dispatch_cuda_h100_822c45d.json": "dispatch_cuda_h100.json",
    "dispatch_cpu_h100host_822c45d.json": "dispatch_cpu_h100host.json",
    # the runs before 899c9a4's (same kernels: the layer, the three fused ops and dispatch measured
    # again on an H100, the layer with its per-layer breakdown); docs/benchmarks.md keeps their numbers
    "vllm_omni_stack_h100_915066e.json": "vllm_omni_stack_h100.json",
    "mhc_h100_915066e.json": "mhc_h100.json",
    "qk_norm_rope_h100_e886b01.json": "qk_norm_rope_h100.json",
    "output_gate_h100_822c45d.json": "output_gate_h100.json",
    "dispatch_cuda_h100_915066e.json": "dispatch_cuda_h100.json",
    "dispatch_cpu_h100host_915066e.json": "dispatch_cpu_h100host.json",
    # dispatch at 899c9a4 and 84ca57e, measured again at 2f6d7e6 (the core in folders); docs/benchmarks.md
    # keeps their numbers
    "dispatch_cuda_h100_899c9a4.json": "dispatch_cuda_h100.json",
    "dispatch_cpu_h100host_899c9a4.json": "dispatch_cpu_h100host.json",
    "dispatch_cuda_h100_84ca57e.json": "dispatch_cuda_h100.json",
    "dispatch_cpu_h100host_84ca57e.json": "dispatch_cpu_h100host.json",
    # 899c9a4's runs of the layer and the two fused ops, measured again at a27c0ad (the layer with the
    # shared-experts swap); docs/benchmarks.md keeps their numbers
    "vllm_omni_stack_h100_899c9a4.json": "vllm_omni_stack_h100.json",
    "mhc_h100_899c9a4.json": "mhc_h100.json",
    "qk_norm_rope_h100_899c9a4.json": "qk_norm_rope_h100.json",
}

# Kept for the record but summarised by hand in docs/benchmarks.md (the notes say why).
DIAGNOSES = {
    "moe_ws_wide_h100_46eae00.json": "the 64-wide-slice MoE prototype against gluon_ws, bit-equal and 7% slower "
    "(docs/moe-notes.md; the prototype's code is in git at 46eae00)",
    "mhc_sweep_h100_62da1f1.json": "the split-BF16 logits kernel's first sweep, 11 of its 24 launches racing",
    "mhc_sweep_h100_bf16x3_eb9bbc1.json": "the split-BF16 kernel with separate accumulators, 3 launches racing",
    "mhc_split_diagnose_h100_62da1f1.json": "the split-BF16 kernel taken apart (docs/benchmarks.md, mHC)",
    "mhc_split_diagnose_h100_eb9bbc1.json": "the split-BF16 kernel taken apart (docs/benchmarks.md, mHC)",
    "mhc_split_diagnose_h100_6f22255.json": "the split-BF16 kernel taken apart (docs/benchmarks.md, mHC)",
    "vllm_omni_stack_h100_shared_off_a27c0ad.json": "the layer with the shared-experts swap off, beside "
    "vllm_omni_stack_h100.json (docs/benchmarks.md, the shared experts)",
    "mhc_mix_pre_h100_1be90fa.json": "a fused mhc_mix + mhc_pre kernel, 3-D tiles (reverted; docs/benchmarks.md)",
    "mhc_mix_pre_h100_9639df8.json": "a fused mhc_mix + mhc_pre kernel, 2-D tiles (reverted; docs/benchmarks.md)",
    "vllm_omni_stack_h100_1be90fa_fused_off.json": "the layer at 1be90fa without the fused mhc_mix_pre swap",
    "vllm_omni_stack_h100_1be90fa_fused_on.json": "the layer at 1be90fa with the fused mhc_mix_pre swap (reverted)",
}


# Summarised, but history: rows for docs/benchmarks.md's earlier-runs table, not the README's (the
# kernel each one measured has since been replaced in the H200 table; CHANGELOG.md says what it decided).
HISTORY = {
    "moe_sweep_h200.json": "the pointer and TMA kernel variants at c2f9f13",
    "moe_sweep_tiles_h200.json": "tile experiments on the pointer and TMA kernels at 64ed769",
    "moe_sweep_gluon_h200.json": "the first Gluon kernel against the TMA kernel at b8ca252",
    "moe_sweep_pdl_h200.json": "the Gluon kernel variants with PDL at ec2824c",
    "moe_ablation_h200.json": "where the 8-warp Gluon kernel's time goes, at ec2824c",
    "moe_sweep_ws_persistent_h200.json": "the warp-specialised kernel before the table took it, at 2969713",
    "dispatch_cuda.json": "dispatch with GPU inputs on the H200 at 8a04f2b, before the mHC and q/k ops",
    "dispatch_cuda_h100_9456316.json": "dispatch with GPU inputs on an H100 host at 9456316, before the output gate",
}


def _ms(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


@dataclass(frozen=True)
class FileCeilings:
    """The copy bandwidth (TB/s) and dense BF16 matmul rate (TFLOP/s) a file's fractions divide by; None
    where the file has no such ceiling of its device."""

    copy_tb_s: float | None
    matmul_tflops: float | None


# The H200's ceilings (measured on one H200, 2026-11-30), which the benchmarks divided by before each run
# measured its own: read only for a file that records no ceilings and was measured on the H200.
H200_CEILINGS = ("NVIDIA H200", FileCeilings(copy_tb_s=4.27, matmul_tflops=679.0))


def file_ceilings(d: Data) -> FileCeilings | None:
    """The ceilings of the device a file was measured on: those it recorded ("ceilings", beside its device:
    at the top or under "env"), measured in its own run; else the H200's constants, if it was measured on
    the H200 (what its benchmark then divided by); else the copy it measured in its run, if it did (the
    first mHC files, "copy_tb_s_measured"); else None: no fractions for that file."""
    env: Data = d["env"] if isinstance(d.get("env"), dict) else {}
    recorded = d.get("ceilings") or env.get("ceilings")
    if recorded:
        return FileCeilings(recorded.get("copy_tb_s"), recorded.get("matmul_tflops"))
    device, reference = H200_CEILINGS
    if (d.get("device") or env.get("device")) == device:
        return reference
    if env.get("copy_tb_s_measured"):
        return FileCeilings(env["copy_tb_s_measured"], None)
    return None


def _copy_tb_s(d: Data) -> float | None:
    c = file_ceilings(d)
    return c.copy_tb_s if c else None


def _tera_per_s(amount: float, ms: float) -> float:
    """``amount`` (FLOP or bytes) done in ``ms`` milliseconds, in tera per second."""
    return amount / (ms * 1e-3) / 1e12


NO_CEILINGS = "no ceilings of this device in the file, so no fractions"


def rmsnorm_rows(d: Data) -> list[Row]:
    copy = _copy_tb_s(d)
    rows: list[Row] = []
    for r in d["rows"]:
        res = r["results"]
        fused = res["fused_triton"]["tb_s"]
        out = r["out_dtype"].replace("torch.", "")
        groups = f"{len(r['modality_sizes'])} modalities" if r["modality_sizes"] else "1 modality"
        rows.append(
            (
                "RMSNorm, fused Triton",
                f"{list(r['shape'])} {r['dtype'].replace('torch.', '')} -> {out}, {groups}",
                f"{fused:.2f} TB/s ({f'{fused / copy:.2f} of copy' if copy else NO_CEILINGS})",
                f"eager composite {res['composite_eager']['tb_s']:.2f}, torch.compile "
                f"{res['composite_compiled']['tb_s']:.2f} TB/s",
                ("output equals its FP32 result cast" if r["output_equals_fp32_cast"] else "CAST MISMATCH")
                + f"; {_device(d)}",
            )
        )
    return rows


def sink_rows(d: Data) -> list[Row]:
    r = max(d["rows"], key=lambda r: r["T"])
    res = r["results"]
    exact = all(v == 0 for v in r["differing_bf16_values_vs_torch"].values())
    return [
        (
            "sink correction, fused Triton",
            f"[{r['T']}, {r['H']}, {r['D']}] bf16",
            f"{res['fused_fp32']['p50_ms'] * 1e3:.0f} us ({res['fused_fp32']['frac_of_copy_time']:.2f} of copy)",
            f"torch fp32 path {res['torch_fp32']['p50_ms'] * 1e3:.0f} us",
            ("bit-exact to the torch reference in both modes" if exact else "DIFFERS from the torch reference")
            + f"; {_device(d)}",
        )
    ]


def attention_rows(d: Data) -> list[Row]:
    long = d["long"]
    ratios = [v["tflops_event_p50"]["resolved_sink"] / v["tflops_event_p50"]["raw_fa3"] for v in long.values()]
    short = [v["resolved_over_best_sink_event_ms"]["ratio"] for v in d["short"].values()]
    chosen = {v["resolution_sink"]["chosen"] for v in d["short"].values()}
    at = f"; {d['device']}, {_short(d['git_commit'])}"
    return [
        (
            "attention with one sink",
            ", ".join(long) + f"; {d['heads']} x {d['head_dim']} {d['dtype']}",
            " / ".join(f"{v['tflops_event_p50']['resolved_sink']:.0f}" for v in long.values()) + " TFLOP/s",
            "raw FA3 " + " / ".join(f"{v['tflops_event_p50']['raw_fa3']:.0f}" for v in long.values()),
            "resolved/raw " + " / ".join(f"{x:.3f}" for x in ratios) + at,
        ),
        (
            "attention, short sweep",
            f"{len(short)} shapes, {min(v['tokens'] for v in d['short'].values())} to "
            f"{max(v['tokens'] for v in d['short'].values())} tokens",
            "with a sink resolves to " + ", ".join(sorted(chosen)),
            "every sink-capable provider, same run",
            f"resolved time / fastest provider: median {statistics.median(short):.2f}, "
            f"range {min(short):.2f}-{max(short):.2f}" + at,
        ),
    ]


def distributed_rows(d: Data) -> list[Row]:
    s = d["shapes"]
    moe, uly = d["layers"]["ep_moe"], d["layers"]["ulysses_attention"]
    bit_equal = all(r["check_vs_one_gpu"]["bit_equal"] for layer in (moe, uly) for r in layer["per_rank"])
    equal = "bit-equal to one GPU" if bit_equal else "NOT bit-equal to one GPU"

    def total(layer: Data) -> str:
        m = layer["rank_max_p50_ms"]
        return f"{m['total']:.2f} ms (a2a {m['a2a_in']:.2f} + {m['a2a_out']:.2f} ms)"

    return [
        (
            f"EP{d['world']} MoE on {d['world']} GPUs",
            f"{s['moe_heads']} heads, {s['tokens_local']} tokens per rank",
            total(moe),
            f"one GPU {moe['one_gpu_p50_ms']:.1f} ms",
            equal,
        ),
        (
            f"Ulysses{d['world']} attention",
            f"{s['attn_heads']} x {s['head_dim']}, T = {s['tokens_local'] * d['world']}",
            total(uly),
            f"one GPU {uly['one_gpu_p50_ms']:.2f} ms",
            equal,
        ),
    ]


DISPATCH_TARGET_US = 5.0  # added per call, judged where serving runs: every input on the GPU


def dispatch_rows(d: Data, where: str = "", judged: bool = False) -> list[Row]:
    by_op = {r["op"]: r for r in d["rows"]}
    over = [op for op, r in by_op.items() if r["added_us"] > DISPATCH_TARGET_US]
    # Files from 6d338da on also time the calls under torch.inference_mode (how vllm-omni serves).
    served = [op for op, r in by_op.items() if r.get("added_inference_us", r["added_us"]) > DISPATCH_TARGET_US]
    inference = all("added_inference_us" in r for r in by_op.values())
    verdict = (
        (
            f"target <= {DISPATCH_TARGET_US:g} us added: "
            + (f"missed by {', '.join(over)}" if over else "met by every op")
            + (
                f" with autograd on, {'missed by ' + ', '.join(served) if served else 'met by every op'} "
                "under inference_mode"
                if inference
                else ""
            )
            + "; "
        )
        if judged
        else ""
    )
    added = (
        (lambda r: f"{r['added_us']:.1f} ({r['added_inference_us']:.1f})")
        if inference
        else (lambda r: f"{r['added_us']:.1f}")
    )
    return [
        (
            "dispatch overhead (CPU)" + (f", {where}" if where else ""),
            "cached resolve / added per call" + (" (under inference_mode)" if inference else ""),
            ", ".join(f"{r['resolve_us']:.1f} / {added(r)} us ({op})" for op, r in by_op.items()),
            "a no-op provider called directly",
            verdict + f"{d['device']}, torch {d.get('torch', '?')}, {_short(d.get('commit', '?'))}",
        )
    ]


def _short(commit: str) -> str:
    return commit[:7]


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def block_rows(d: Data) -> list[Row]:
    env, c = d["env"], d["config"]
    at = f"{env['device']}, {env['git_commit']}"
    rows: list[Row] = []
    for p in d["packs"].values():
        ms, ops = p["block_ms"], p["ops"]
        rows.append(
            (
                f"MAGI-2 block, {c['layers']} layers",
                f"[{'/'.join(str(s) for s in p['segments'])}] ({p['tokens']} tokens): RMSNorm, attention "
                f"{c['attn_heads']} x {c['head_dim']} with a sink, RMSNorm, route + MoE {c['moe_heads']} heads x "
                f"{c['experts']} experts top-{c['top_k']}",
                "eager / compile / graph "
                + " / ".join(_ms(ms[m]["p50"]) for m in ("eager", "compile", "graph"))
                + " ms",
                f"ops alone summed {_ms(ops['magi2_stack_sum_ms'])} ms; user stack (F.rms_norm, "
                f"{p['baseline_attention']}, torch routing, `_grouped_mm`) eager {_ms(ms['baseline_eager']['p50'])}"
                f" / graph {_ms(ms['baseline_graph']['p50'])} ms",
                f"graph / ops alone {ms['graph']['p50'] / ops['magi2_stack_sum_ms']:.3f}; user stack / magi2 eager "
                f"{ms['baseline_eager']['p50'] / ms['eager']['p50']:.1f}x; {at}",
            )
        )
    route = d["route_vs_experts"]
    limit = d["targets_def"]["route_vs_experts"]
    missed_t = [r["tokens"] for r in route if r["route_over_experts_graph"] > limit]
    rows.append(
        (
            "MoE route share of experts (block)",
            "T = " + " / ".join(str(r["tokens"]) for r in route),
            "route / experts (graph) " + " / ".join(f"{r['route_over_experts_graph']:.2f}" for r in route),
            "experts (graph) " + " / ".join(_ms(r["graph_ms"]["experts"]["p50"]) for r in route) + " ms",
            f"target <= {limit:.2f}: "
            + (f"MISSED at T = {', '.join(str(t) for t in missed_t)}" if missed_t else "met")
            + _route_check(route)
            + f"; {at}",
        )
    )
    for name, orc in d.get("oracle", {}).items():
        rows.append(_oracle_row(name, orc, c, at))
    det, targets = d["deterministic"], d["targets"]
    missed = [k for k, ok in targets.items() if not ok]
    rows.append(
        (
            "MoE deterministic mode (block)",
            f"T = {det['tokens']}",
            f"{_ms(det['ms']['deterministic']['p50'])} ms ({det['ratio']:.2f}x default)",
            f"default {_ms(det['ms']['default']['p50'])} ms",
            ("runs bitwise equal" if det["deterministic_runs_bitwise_equal"] else "runs DIFFER")
            + f"; block targets met {len(targets) - len(missed)} of {len(targets)}"
            + (f", missed: {'; '.join(missed)}" if missed else "")
            + f"; {at}",
        )
    )
    return rows


def _route_check(route: list[Data]) -> str:
    if all("route_contract_ok" in r for r in route):  # runs after the routing contract moved to float64 truth
        held = all(r["route_contract_ok"] for r in route)
        return "; routes hold the routing contract" if held else "; CONTRACT BROKEN"
    return "; ids equal the reference" if all(r["ids_equal_reference"] for r in route) else "; IDS DIFFER"


def _oracle_row(name: str, orc: Data, c: Data, at: str) -> Row:
    """Per-layer error of both stacks against the FP32 oracle on the same input (benchmarks/block.py)."""
    layers = orc["layers"]

    def span(path: str, key: str) -> str:
        vals = [row[path][key] for row in layers]
        return f"{min(vals):.2e}-{max(vals):.2e}"

    drift = orc["stack_drift"][-1]
    wins = sum(
        row["magi2"]["layer_increment_clean_rows"] <= row["baseline"]["layer_increment_clean_rows"] for row in layers
    )
    return (
        f"MAGI-2 block accuracy, {len(layers)} layers",
        f"{name}: each layer against an FP32 oracle on the same input (rel-L2 of the layer increment)",
        f"magi2 {span('magi2', 'layer_increment_clean_rows')} on tokens routed as the oracle; "
        f"{span('magi2', 'layer_increment')} on all",
        f"user stack {span('baseline', 'layer_increment_clean_rows')} / {span('baseline', 'layer_increment')}; "
        f"rows routed other than the oracle {span('magi2', 'route_rows_other_experts')} (magi2), "
        f"{span('baseline', 'route_rows_other_experts')} (user stack)",
        f"magi2 <= user stack on {wins} of {len(layers)} layers (tokens routed as the oracle); after "
        f"{len(layers)} layers each on its own stream: magi2 vs oracle {drift['magi2_vs_oracle']:.3f}, user stack "
        f"vs oracle {drift['baseline_vs_oracle']:.3f}, magi2 vs user stack {drift['magi2_vs_baseline']:.3f} "
        f"(route flips, docs/moe-notes.md); {at}",
    )


def vllm_omni_stack_rows(d: Data) -> list[Row]:
    """vllm-omni's own MAGI-2 layers, plugin off vs on (benchmarks/vllm_omni_stack.py)."""
    c = d["config"]
    at = f"{d['device']}, {_short(d['git_commit'])}"
    rows: list[Row] = []
    for mode in ("eager", "compiled"):
        runs = [r for r in d["results"] if r["mode"] == mode]
        if not runs:
            continue
        ts = " / ".join(str(r["tokens"]) for r in runs)
        rows.append(
            (
                f"vllm-omni MAGI-2 layers, {mode}" + (" (`compile_regions`)" if mode == "compiled" else ""),
                f"vllm-omni {d['vllm_omni']}'s transformer blocks, {c['moe_layers']} layers, hidden {c['hidden']}, "
                f"{c['heads_q']} x {c['head_dim']} attention, MoE {c['moe_heads']} heads x {c['experts']} experts; "
                f"T = {ts}",
                "plugin on " + " / ".join(_ms(r["ms_per_layer"]["on"]["p50"]) for r in runs) + " ms per layer",
                "plugin off " + " / ".join(_ms(r["ms_per_layer"]["off"]["p50"]) for r in runs) + " ms per layer",
                "speed-up " + " / ".join(f"{r['speedup']:.2f}x" for r in runs) + f"; {at}",
            )
        )
    return rows


def moe_layers_rows(d: Data) -> list[Row]:
    s, runs = d["shape"], d["layers_in_turn"]
    at = f"{d['device']}, {_short(d['commit'])}"
    ts = " / ".join(str(r["tokens"]) for r in runs)

    def col(key: str) -> str:
        return " / ".join(_ms(r[key]["p50"]) for r in runs)

    b = runs[0]["bytes_per_layer"]
    repacks = sorted({r["repacks_after_first_pass"] for r in runs})
    return [
        (
            f"MoE experts, {runs[0]['layers']} layers in turn",
            f"{runs[0]['heads']} heads x {s['E']} experts, top-{s['K']}; T = {ts}; `m2.moe_experts`",
            f"prepared eager {col('prepared_in_turn')} ms per call",
            f"one layer repeated {col('one_layer_repeated')}; raw weights in turn {col('raw_in_turn')} ms",
            "in turn / repeated "
            + " / ".join(f"{r['in_turn_over_repeated']:.3f}" for r in runs)
            + f"; re-packs after the first pass {'/'.join(str(x) for x in repacks)}; {at}",
        ),
        (
            f"MoE experts, {runs[0]['layers']} layers in turn, graph / compile",
            f"T = {ts}",
            f"prepared graph {col('prepared_in_turn_graph')}, compiled {col('prepared_in_turn_compiled')} ms",
            f"raw weights graph {col('raw_in_turn_graph')} ms",
            f"bytes per layer: raw {_gb(b['raw_tensors'])} (a raw call {_gb(b['raw_plus_cached_bank'])} with the "
            f"cached bank), prepared {_gb(b['prepared'])}; deterministic / default "
            + " / ".join(f"{r['deterministic_over_default']:.2f}" for r in runs)
            + f"; {at}",
        ),
    ]


# Issue 15's targets for the fused MoE kernel (graph p50, ms): (tokens, heads) -> target, set for the
# H200 and judged on that device's files only.
MOE_TARGETS = {(14601, 3): 1.0, (4096, 3): 0.45, (512, 3): 0.37, (4096, 12): 1.6}
MOE_TARGETS_DEVICE = "NVIDIA H200"


def _moe_fractions(c: FileCeilings | None, points: list[tuple[Data, float]]) -> str | None:
    """ "at M of the matmul ceiling, W of the weight floor" for MoE shapes (their ``flops`` and
    ``weight_bytes``), each at a p50 (ms), against the file's ceilings; None where it has none."""
    if c is None or c.matmul_tflops is None or c.copy_tb_s is None:
        return None
    mm = " / ".join(f"{_tera_per_s(work['flops'], p50) / c.matmul_tflops:.2f}" for work, p50 in points)
    wf = " / ".join(f"{_tera_per_s(work['weight_bytes'], p50) / c.copy_tb_s:.2f}" for work, p50 in points)
    return f"at {mm} of the matmul ceiling, {wf} of the weight floor"


def _graph_fractions(c: FileCeilings | None, bs: list[Data]) -> str:
    fractions = _moe_fractions(c, [(b, b["fused_graph"]["p50"]) for b in bs])
    return f"graph {fractions}" if fractions else NO_CEILINGS


def moe_bench_rows(d: Data) -> list[Row]:
    """`benchmarks/moe.py` files with eager and graph times of the table's kernel, the previous kernel and
    `_grouped_mm` (the schema since the warp-specialised kernel)."""
    s, at = d["shape"], f"{d['device']}, {_short(d.get('git_commit') or d['commit'])}"
    ceilings = file_ceilings(d)
    rows: list[Row] = []
    for heads in sorted({b["heads"] for b in d["bench"]}):
        bs = [b for b in d["bench"] if b["heads"] == heads]

        def col(key: str, bs: list[Data] = bs) -> str:
            return " / ".join(_ms(b[key]["p50"]) if key in b else "-" for b in bs)

        rows.append(
            (
                "MoE experts, fused (" + " / ".join(b["tiles"]["variant"] for b in bs) + ")",
                f"{heads} heads x {s['E']} experts, top-{s['K']}, d {s['d']}, I {s['I']}; T = "
                + " / ".join(str(b["tokens"]) for b in bs),
                f"graph {col('fused_graph')} ms; eager {col('fused')} ms",
                f"previous kernel (one_kernel) graph {col('previous_graph')}, eager {col('previous')}; torch "
                f"`_grouped_mm` eager {col('native')}, graph {col('native_graph')} ms",
                _graph_fractions(ceilings, bs)
                + "; eager / graph "
                + " / ".join(f"{b['fused_eager_over_graph']:.2f}" for b in bs)
                + f"; rel-L2 <= {max(b['fused_rel_l2'] for b in bs):.1e}; {at}",
            )
        )
    graph = {(b["tokens"], b["heads"]): b["fused_graph"]["p50"] for b in d["bench"] if "fused_graph" in b}
    targets = {k: v for k, v in MOE_TARGETS.items() if k in graph}
    if targets and d["device"] == MOE_TARGETS_DEVICE:
        met = [graph[k] <= v for k, v in targets.items()]
        rows.append(
            (
                "MoE speed targets, through the table (graph p50)",
                ", ".join(f"T = {t} x {h} heads <= {v} ms" for (t, h), v in targets.items()),
                " / ".join(_ms(graph[k]) for k in targets) + " ms",
                "-",
                ("all met" if all(met) else f"NOT met ({met.count(True)} of {len(met)})") + f"; {at}",
            )
        )
    return rows


def moe_align_rows(d: Data) -> list[Row]:
    """`benchmarks/moe_align.py`: the route alignments alone and the call in both modes (graph p50)."""
    at = f"{d['device']}, {_short(d['git_commit'])}"
    rows: list[Row] = []
    for r in d["shapes"]:
        g = {k: v["p50"] for k, v in r["graph_ms"].items()}
        us = {k: f"{1e3 * g[k]:.1f}" for k in ("atomic", "stable_kernels", "stable_torch")}
        rows.append(
            (
                "MoE route alignment (graph p50)",
                f"T = {r['tokens']}, {r['heads']} heads ({r['experts']} experts); chunk {r['chunk']}",
                f"stable kernels {us['stable_kernels']} us; call deterministic {_ms(g['op_deterministic'])} ms",
                f"atomic kernels {us['atomic']} us, torch stable sort {us['stable_torch']} us; call default "
                f"{_ms(g['op_default'])} ms",
                (
                    "stable kernels equal the torch sort bit for bit"
                    if r["stable_kernels_equal_torch"]
                    else "stable kernels DIFFER from the torch sort"
                )
                + (
                    "; deterministic call repeats bit for bit"
                    if r["deterministic_repeats_bitwise"]
                    else "; deterministic call does NOT repeat"
                )
                + f"; {at}",
            )
        )
    return rows


def moe_ablation_rows(d: Data) -> list[Row]:
    at = f"{d['device']}, {_short(d['commit'])}"
    pieces = ("no SwiGLU7 math", "no gate/up MMA", "no weight refill", "no gather", "no output store")
    rows: list[Row] = []
    for r in d["shapes"]:
        v = r["variants"]
        rows.append(
            (
                "MoE 8-warp Gluon kernel, one piece left out (graph p50)",
                f"T = {r['tokens']}, {r['heads']} heads; kernel alone",
                f"whole {_ms(v['whole']['graph']['p50'])} ms",
                "; ".join(f"{p} saves {100 * v[p]['saved_fraction']:.0f}%" for p in pieces),
                f"first and last slice only {_ms(v['first and last slice only']['graph']['p50'])} ms; executed "
                f"{r['whole_executed_tflops']:.0f} TFLOP/s; {at}",
            )
        )
    return rows


def _sweep_shapes(d: Data) -> dict[tuple[int, int], Data]:
    """The sweep's passes merged per (tokens, heads): floors and every variant (base from the first pass)."""
    merged: dict[tuple[int, int], Data] = {}
    for s in d["shapes"]:
        m = merged.setdefault((s["tokens"], s["heads"]), {**s, "variants": {}})
        for name, v in s["variants"].items():
            m["variants"].setdefault(name, v)
    return merged


def moe_sweep_rows(d: Data) -> list[Row]:
    at = f"{d['device']}, {d['git_commit']}"
    ceilings = file_ceilings(d)
    rows: list[Row] = []
    for (t, h), s in sorted(_sweep_shapes(d).items(), key=lambda kv: (kv[0][1], kv[0][0])):
        vs = s["variants"]
        best = min(vs, key=lambda n: vs[n]["graph"]["p50"])
        p50 = vs[best]["graph"]["p50"]
        bit_equal = all(v["bit_equal_base"] for v in vs.values())
        # the base is the H200 table's kernel at the run's commit (pointer in the first sweeps)
        base_kind = vs["base"].get("tiles", {}).get("variant", "pointer")  # the one_kernel variant's name then
        others = ", ".join(
            f"{n} {_ms(v['graph']['p50'])} ({v['graph_speedup_vs_base']:.3f}x)" for n, v in vs.items() if n != "base"
        )
        fractions = _moe_fractions(ceilings, [(s, p50)])
        note = (
            (f"best {fractions}" if fractions else NO_CEILINGS)
            + f"; {len(vs)} variants "
            + (
                f"bit-equal to the base (the table's `{base_kind}` kernel then)"
                if bit_equal
                else f"NOT all bit-equal to the base (the table's `{base_kind}` kernel then)"
            )
        )
        rows.append(
            (
                "MoE kernel variants (graph p50)",
                f"T = {t}, {h} heads",
                f"best {base_kind if best == 'base' else best} {_ms(p50)} ms "
                f"({vs[best]['graph_speedup_vs_base']:.3f}x {base_kind})",
                f"{base_kind} {_ms(vs['base']['graph']['p50'])} ms; {others}",
                note + f"; {at}",
            )
        )
    return rows  # the targets are judged once, on the newest moe.py run (moe_bench_rows)


def attention_fa4_rows(d: Data) -> list[Row]:
    at = f"{d['device']}, {d['git_commit']}, FA4 {d['flash_attn_4']}"
    rows: list[Row] = []
    for group, label in (("long", "long packs"), ("short", "short packs"), ("single", "single segments")):
        shapes = d[group]

        def col(key: str, shapes: Data = shapes) -> str:
            return " / ".join(_ms(v["event_ms"][key]["p50"]) for v in shapes.values())

        chosen = [v["resolution_sink"]["chosen"] for v in shapes.values()]
        fastest = sum(
            v["sink_winner_event_ms"]["best"] == v["sink_winner_event_ms"]["resolved"] for v in shapes.values()
        )
        rows.append(
            (
                f"attention with a sink, FA4 vs FA3, {label}",
                ", ".join(shapes) + f"; {d['heads']} x {d['head_dim']} {d['dtype']}",
                f"resolved {col('resolved_sink')} ms (chose {', '.join(chosen)})",
                f"FA4 native sink {col('fa4_sink')}; FA3 + fused correction {col('fa3_fused_sink')}; raw FA3 "
                f"(no sink) {col('raw_fa3')} ms",
                "FA4 / FA3+correction "
                + " / ".join(f"{v['sink_winner_event_ms']['fa4_over_fa3_fused']:.2f}" for v in shapes.values())
                + f"; resolved = the faster sink provider in {fastest} of {len(shapes)}; {at}",
            )
        )
    jit = d["jit"]
    kinds = [k for k in ("sink", "nosink", "sink_lse", "nosink_lse") if k in jit]
    rows.append(
        (
            "FA4 first call (CuTe DSL JIT)",
            f"{jit['shape']}, " + " / ".join(kinds),
            "first call " + " / ".join(f"{jit[k]['first_call_s']:.2f}" for k in kinds) + " s",
            "cached call " + " / ".join(f"{jit[k]['cached_call_ms']:.3f}" for k in kinds) + " ms",
            f"import {jit['import_s']:.1f} s; {at}",
        )
    )
    return rows


def vllm_omni_moe_rows(d: Data) -> list[Row]:
    s, prep = d["shape"], d["prepared"]
    at = f"{d['device']}, {d['git_commit']}"
    rows: list[Row] = []
    for r in d["results"]:
        st, alone = r["stack_ms_per_layer"], r["layer0_alone_ms"]
        rows.append(
            (
                "vllm-omni MoE layer stack",
                f"{r['layers']} layers, {s['local_heads']} heads x {s['experts']} experts top-{s['top_k']}, "
                f"T = {r['tokens']}; weights prepared at load ({prep['layout']})",
                f"eager {_ms(st['layer_eager']['p50'])} / graph {_ms(st['layer_graph']['p50'])} ms per layer",
                f"route + experts alone {_ms(r['moe_share_ms'])} ms (route {_ms(alone['moe_route']['p50'])} + "
                f"experts {_ms(alone['moe_experts']['p50'])})",
                f"layer / ops eager {r['ratios']['layer_over_ops_eager']:.3f}, graph "
                f"{r['ratios']['layer_over_ops_graph']:.3f}; "
                + ("within 5%" if r["within_target"] else "NOT within 5%")
                + f"; {at}",
            )
        )
    return rows


def moe_tile_rows(d: Data) -> list[Row]:
    at = f"{d['device']}, {d['git_commit']}"
    rows: list[Row] = []
    for (t, h), s in sorted(_sweep_shapes(d).items(), key=lambda kv: (kv[0][1], kv[0][0])):
        vs = s["variants"]
        tried = ", ".join(
            f"{n} {_ms(v['graph']['p50'])} ({v['graph_speedup_vs_base']:.3f}x)"
            if "graph" in v
            else f"{n} not run here (it failed at an earlier shape)"
            if "failed earlier" in str(v)
            else f"{n} did not compile" + (" (out of shared memory)" if "OutOfResources" in str(v) else "")
            for n, v in vs.items()
            if n != "base"
        )
        faster = [n for n, v in vs.items() if n != "base" and v.get("graph_speedup_vs_base", 0.0) > 1.01]
        verdict = f"faster than the table's: {', '.join(faster)}" if faster else "none > 1% faster than the table's"
        rows.append(
            (
                "MoE tile experiments (graph p50)",
                f"T = {t}, {h} heads",
                f"table tiles {_ms(vs['base']['graph']['p50'])} ms",
                tried,
                f"{verdict}; {at}",
            )
        )
    return rows


def route_profile_rows(d: Data) -> list[Row]:
    at = f"{d['device']}, {d['git_commit']}"
    rows: list[Row] = []
    for r in d["rows"]:
        ms = {k: v["p50"] for k, v in r["ms"].items()}
        sel = r["selection"]
        exact = all(v["ids_equal_reference"] for v in sel.values())
        rows.append(
            (
                "moe_route pieces (graph p50)",
                f"T = {r['tokens']}, 3 heads x 256 experts, top-6",
                f"triton route {_ms(ms['route_triton'])} ms (reference {_ms(ms['route_reference'])} ms)",
                f"FP32 upcast {_ms(ms['upcast'])} + FP32 router GEMM {_ms(ms['logits_fp32'])} + sigmoid "
                f"{_ms(ms['sigmoid'])} + selection {_ms(ms['select'])} ms; TF32 GEMM {_ms(ms['logits_tf32'])} ms "
                f"changes {r['accuracy']['logits_tf32']['rows_ids_differ_vs_fp32_gemm']} rows' ids",
                ("ids equal the reference in every configuration" if exact else "ids NOT equal to the reference")
                + f"; {at}",
            )
        )
    return rows


def route_fused_rows(d: Data) -> list[Row]:
    """`benchmarks/route_profile.py` since the fused router: the route's share of the experts, same run."""
    at = f"{d['device']}, {d['git_commit']}"
    rows: list[Row] = []
    for r in d["rows"]:
        ms = {k: v["p50"] for k, v in r["ms"].items()}
        # runs at 4556481 also timed the prepared router's planes against the in-register split
        unprepared = f"without preparation {_ms(ms['fused_unprepared'])} ms; " if "fused_unprepared" in ms else ""
        # later runs time every config reading prepared planes too, and the kernel without each half
        planes = {k: v for k, v in ms.items() if k.startswith("fused[") and k.endswith("+planes]")}
        if planes:
            best_planes = min(planes, key=planes.__getitem__)
            unprepared += f"best with prepared planes {best_planes} {_ms(planes[best_planes])} ms; "
        gemm = {k: v for k, v in ms.items() if k.startswith("gemm_only[")}
        if gemm:  # the kernel with its selection left out: the default config's, and the fastest one's
            name = f"gemm_only[{r['default_config']}]"
            unprepared += f"its GEMM alone {_ms(ms[name])} ms; " if name in gemm else ""
            unprepared += f"fastest GEMM alone {_ms(min(gemm.values()))} ms; "
        acc = r["accuracy"]
        wrong = sum(v["clear_rows_wrong"] for a in acc.values() for k, v in a.items() if k.startswith("fused"))
        ok = all(v["contract_ok"] for a in acc.values() for k, v in a.items() if k.startswith("fused"))
        rows.append(
            (
                "moe_route, fused router (graph p50)",
                f"T = {r['tokens']}, {r['heads']} heads x 256 experts, top-6",
                f"fused {_ms(ms['fused'])} ms = {r['share_of_experts']['fused']:.1%} of the experts "
                f"({_ms(ms['experts'])} ms); vllm-omni main {_ms(ms['vllm_omni_main'])} ms",
                f"best config {r['best_config']} {_ms(ms[r['best_config']])} ms; {unprepared}"
                f"current triton {_ms(ms['triton'])} ms",
                ("routing contract holds" if ok else "ROUTING CONTRACT VIOLATED")
                + f", {wrong} clear-row id differences (random and planted inputs); {at}",
            )
        )
    return rows


def profile_check_rows(d: Data) -> list[Row]:
    """One `benchmarks/profile_check.py` run: does the active profile pick the fastest eligible provider and plan?"""
    s, prof, env = d["summary"], d["profile"], d["env"]
    kind = {"env": "named by MAGI2_PROFILE", "generic": "generic (derived from the capability)"}.get(
        prof["source"], prof["source"]
    )
    if prof["name"].startswith("tuned-"):
        kind = "written by `magi2 tune` earlier in the same run"
    ops = sorted({p["op"] for p in d["points"]})
    met = s["points"] - len(s["failed"])
    fell = (
        f"; fell to the reference: {', '.join(s['fell_to_reference'])}"
        if s["fell_to_reference"]
        else "; none fell to the reference"
    )
    return [
        (
            f"device profile check, {prof['name']}",
            f"{s['points']} grid points ({', '.join(ops)})",
            f"worst choice {s['worst_ratio']:.3f}x the fastest (resolved provider and plan, forced)",
            f"every eligible provider forced and every MoE plan, same run, {d['reps']} calls each; "
            f"the resolved call itself worst {s['worst_call_ratio']:.3f}x (not judged)",
            f"profile {kind}; target <= {d['bar']:g}x: met at {met} of {s['points']} points{fell}; "
            f"{env['device']}, {_short(env['git_commit'])}",
        )
    ]


# The newest `benchmarks/moe.py` run (the table's kernel, the previous kernel and `_grouped_mm`; also plotted).
MOE_BENCH = "moe_h200_cabdec4.json"


def moe_raw_rows(d: Data) -> list[Row]:
    rows = d["rows"]
    fresh = all(r["fresh_after_data_copy"]["ok"] and r["raw_equals_prepared_bitwise"] for r in rows)
    return [
        (
            "MoE experts, raw weights read in place",
            "T = " + " / ".join(str(r["tokens"]) for r in rows),
            "raw "
            + " / ".join(_ms(r["ms"]["raw"]["p50"]) for r in rows)
            + " ms ("
            + " / ".join(f"{r['raw_over_prepared']:.2f}x" for r in rows)
            + " prepared)",
            "prepared "
            + " / ".join(_ms(r["ms"]["prepared"]["p50"]) for r in rows)
            + " ms; re-packed per call "
            + " / ".join(_ms(r["ms"]["raw_repacked"]["p50"]) for r in rows)
            + " ms",
            ("bit-equal to prepared, fresh after .data.copy_" if fresh else "NOT equal or NOT fresh")
            + f"; {d['device']}, {_short(d['git_commit'])}",
        )
    ]


def mhc_rows(d: Data) -> list[Row]:
    """The fused mHC pair against vllm-omni's own path and the upstream form (benchmarks/mhc.py)."""
    copy, env = _copy_tb_s(d), d["env"]
    rows: list[Row] = []
    for r in d["rows"]:
        res = {k: v["p50_ms"] for k, v in r["results"].items()}
        fused = r["results"]["fused_triton"]
        base = ", ".join(f"{k.replace('_', ' ')} {v:.2f} ms" for k, v in res.items() if k != "fused_triton")
        passed = all(v.split(" ", 1)[0] == "PASS" or ": PASS" in v for v in r["acceptance"])
        rows.append(
            (
                "mHC, mhc_pre + mhc_mix (one branch), fused Triton",
                f"[{r['tokens']}, {r['streams']}, {r['width']}] bfloat16, {len(r['modality_sizes'])} modalities",
                f"{res['fused_triton']:.2f} ms ("
                + (f"{fused['tb_s_design_bytes'] / copy:.2f} of copy on the design's bytes" if copy else NO_CEILINGS)
                + ")",
                base,
                ("every output passes the contract" if passed else "A CONTRACT RULE FAILED")
                + f"; {env['device']}, {_short(env['git_commit'])}",
            )
        )
    return rows


def _fused_op_rows(d: Data, what: str, shape: Callable[[Data], str], passes: str) -> list[Row]:
    """A fused op against vllm-omni's own form, eager and compiled (benchmarks/qk_norm_rope.py, output_gate.py)."""
    copy, env = _copy_tb_s(d), d["env"]
    rows: list[Row] = []
    for r in d["rows"]:
        res = r["results"]
        fused = res["fused_triton"]
        base = ", ".join(f"{k.replace('_', ' ')} {v['p50_ms']:.3f} ms" for k, v in res.items() if k != "fused_triton")
        passed = all(": PASS" in v for v in r["acceptance"])
        rows.append(
            (
                what,
                shape(r),
                f"{fused['p50_ms']:.3f} ms ("
                + (f"{fused['tb_s_minimum_bytes'] / copy:.2f} of copy on the minimum bytes" if copy else NO_CEILINGS)
                + ")",
                base,
                (passes if passed else "A CONTRACT RULE FAILED") + f"; {env['device']}, {_short(env['git_commit'])}",
            )
        )
    return rows


def qk_norm_rope_rows(d: Data) -> list[Row]:
    """The fused q/k norm + RoPE against vllm-omni's own form, eager and compiled (benchmarks/qk_norm_rope.py)."""
    return _fused_op_rows(
        d,
        "q/k norm + gather + RoPE (q and k of one attention), fused Triton",
        lambda r: (
            f"[{r['tokens']}, {r['heads']}, {r['head_dim']}] bfloat16, {r['rotary_dim']} rotated, "
            f"{len(r['modality_sizes'])} modalities"
        ),
        "q and k pass the contract",
    )


def output_gate_rows(d: Data) -> list[Row]:
    """The fused output gate against vllm-omni's own form, eager and compiled (benchmarks/output_gate.py)."""
    return _fused_op_rows(
        d,
        "attention output gather + sigmoid gate, fused Triton",
        lambda r: f"[{r['tokens']}, {r['heads']}, {r['head_dim']}] bfloat16, {len(r['modality_sizes'])} modalities",
        "the kernel and upstream's eager form pass the contract",
    )


def _groups(d: Data) -> str:
    """``, N modality groups`` where the sweep's file records them (files before 7f8ae67 do not)."""
    sizes = d.get("modality_sizes")
    return "" if sizes is None else f", {len(sizes)} modality group" + ("" if len(sizes) == 1 else "s")


def mhc_sweep_rows(d: Data) -> list[Row]:
    """mhc_pre's logits-kernel launches: the fastest passing one against the default of that run."""
    env, timed = d["env"], [r for r in d["rows"] if "p50_ms" in r]
    best = min((r for r in timed if r["pass"]), key=lambda r: r["p50_ms"])
    default = next(r for r in timed if r["config"] == d["default"])
    return [
        (
            "mhc_pre, logits-kernel launches (benchmarks/mhc_sweep.py)",
            f"{d['tokens']} tokens x 4 x 3072{_groups(d)}, {len(timed)} launches",
            f"fastest passing: {best['name']} {best['p50_ms']:.2f} ms ({best['of_copy']:.2f} of copy)",
            f"the run's default {default['name']} {default['p50_ms']:.2f} ms",
            f"{sum(r['pass'] for r in timed)} of {len(timed)} pass the contract; "
            f"{env['device']}, {_short(env['git_commit'])}",
        )
    ]


SUMMARISERS: dict[str, Callable[[Data], list[Row]]] = {
    "moe_raw_h100.json": moe_raw_rows,
    "mhc_h100.json": mhc_rows,
    "qk_norm_rope_h100.json": qk_norm_rope_rows,
    "output_gate_h100.json": output_gate_rows,
    "mhc_sweep_h100.json": mhc_sweep_rows,
    "mhc_sweep_h100_3739.json": mhc_sweep_rows,
    "mhc_sweep_h100_14601.json": mhc_sweep_rows,
    "mhc_sweep_h100_14601_one_group.json": mhc_sweep_rows,
    "rmsnorm_h200.json": rmsnorm_rows,
    "sink_correction_h200.json": sink_rows,
    "rmsnorm_h100.json": rmsnorm_rows,
    "sink_correction_h100.json": sink_rows,
    "block_h100.json": block_rows,
    "attention_h200_final.json": attention_rows,
    "distributed_h200x2.json": distributed_rows,
    "dispatch_cpu.json": functools.partial(dispatch_rows, where="the loaded 2-core development machine"),
    "dispatch_cpu_h200host.json": functools.partial(dispatch_rows, where="the H200 host's quiet CPU"),
    "dispatch_cuda.json": functools.partial(dispatch_rows, where="the H200 host, every input on the GPU"),
    "dispatch_cuda_h100.json": functools.partial(
        dispatch_rows, where="the H100 host, every input on the GPU", judged=True
    ),
    "dispatch_cpu_h100host.json": functools.partial(dispatch_rows, where="the H100 host's CPU"),
    "dispatch_cuda_h100_9456316.json": functools.partial(dispatch_rows, where="an H100 host, every input on the GPU"),
    "attention_fa4_h200.json": attention_fa4_rows,
    "block_h200.json": block_rows,
    "moe_layers_h200.json": moe_layers_rows,
    "moe_sweep_h200.json": moe_sweep_rows,
    "moe_sweep_tiles_h200.json": moe_tile_rows,
    "moe_sweep_gluon_h200.json": moe_sweep_rows,
    MOE_BENCH: moe_bench_rows,
    "moe_layers_h200_73cdf12.json": moe_layers_rows,
    "moe_align_h200_cabdec4.json": moe_align_rows,
    "route_profile_h200.json": route_profile_rows,
    "route_fused_h200_589d461.json": route_fused_rows,
    "vllm_omni_moe_h200.json": vllm_omni_moe_rows,
    "vllm_omni_stack_h200.json": vllm_omni_stack_rows,
    "vllm_omni_stack_h100.json": vllm_omni_stack_rows,
    "moe_ablation_h200.json": moe_ablation_rows,
    "moe_sweep_pdl_h200.json": moe_sweep_rows,
    "moe_sweep_ws_persistent_h200.json": moe_sweep_rows,
    "profile_check_tuned_h200.json": profile_check_rows,
    "profile_check_shipped_h200.json": profile_check_rows,
    "profile_check_generic_h200.json": profile_check_rows,
    "attention_h100.json": attention_rows,
    "moe_h100.json": moe_bench_rows,
    "profile_check_shipped_h100.json": profile_check_rows,
    "profile_check_h200_h100.json": profile_check_rows,
    "profile_check_tuned_h100.json": profile_check_rows,
    "profile_check_generic_h100.json": profile_check_rows,
    "profile_check_generic_h100_run1.json": profile_check_rows,
}


# -- a whole DiT step (benchmarks/results/dit_step_<device>.json) ----------------------------------
DIT_STEP = "dit_step_"  # prefix of the files: one per device, records of (mode, plugin, form, s_per_step)


def _dit_records(d: Data | list[Data]) -> list[Data]:
    """The file's records: the file itself when it is a list, else its list under a usual key."""
    if isinstance(d, list):
        return d
    for key in ("records", "results", "rows"):
        if isinstance(d.get(key), list):
            return list(d[key])
    raise KeyError("records")


def _plugin_on(value: object) -> bool:
    return value not in (False, None, 0, "", "off", "none", "false", "False")


def _dit_step(d: Data | list[Data]) -> list[tuple[str, list[tuple[str, float, float]]]]:
    """Per form: (mode, seconds per step with the plugin on, off) for each mode that has both."""
    by: dict[str, dict[str, dict[bool, float]]] = {}
    for r in _dit_records(d):
        if "s_per_step" not in r:  # checks, memory and compile records carry no step time
            continue
        banks = f"{r.get('banks')} bank" + ("" if r.get("banks") == 1 else "s")
        form = str(r["form"]) + (f", {banks}, per MoE layer" if r["form"] == "distinct-banks" else "")
        by.setdefault(form, {}).setdefault(str(r["mode"]), {})[_plugin_on(r["plugin"])] = float(r["s_per_step"]["p50"])
    return [
        (form, [(m, t[True], t[False]) for m, t in modes.items() if True in t and False in t])
        for form, modes in by.items()
    ]


def _secs(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _unit(form: str) -> str:
    return "layer" if form.endswith("per MoE layer") else "step"


def dit_step_rows(d: Data) -> list[Row]:
    """The whole DiT step of MAGI-2 in vllm-omni, plugin on against off (seconds per step, p50)."""
    where = d.get("device", "?") if isinstance(d, dict) else "?"
    commit = d.get("git_commit", d.get("commit", "?")) if isinstance(d, dict) else "?"
    return [
        (
            f"whole DiT step ({form})",
            ", ".join(m for m, _, _ in runs),
            "plugin on " + " / ".join(_secs(on) for _, on, _ in runs) + f" s per {_unit(form)}",
            "plugin off " + " / ".join(_secs(off) for _, _, off in runs) + f" s per {_unit(form)}",
            "speed-up " + " / ".join(f"{off / on:.2f}x" for _, on, off in runs) + f"; {where}, {_short(commit)}",
        )
        for form, runs in _dit_step(d)
        if runs
    ] + _dit_floor_rows(d)


def _dit_floor_rows(d: Data) -> list[Row]:
    """The fastest plugin-on step beside the step's BF16 matmul floor, where the file measured its ceilings."""
    if not isinstance(d, dict) or "matmul_floor_s" not in d:
        return []
    runs = [(m, on) for form, rs in _dit_step(d) if _unit(form) == "step" for m, on, _ in rs]
    if not runs:
        return []
    mode, best = min(runs, key=lambda r: r[1])
    floor, tflops = float(d["matmul_floor_s"]), float(d["ceilings"]["matmul_tflops"])
    return [
        (
            "whole DiT step against its BF16 matmul floor",
            mode,
            f"plugin on {_secs(best)} s per step",
            f"floor {_secs(floor)} s (its BF16 products at {tflops:.0f} TFLOP/s, measured)",
            f"floor / step {floor / best:.2f}; {d.get('device', '?')}, {_short(d.get('git_commit', '?'))}",
        )
    ]


# -- the README's headline table -----------------------------------------------------------------
Headline = tuple[str, str, str]  # what (p50), magi2-core, baseline in the same run
HEADLINE_HEAD = ["| result (p50) | magi2-core | baseline, same run | on |", "| --- | --- | --- | --- |"]
HEADLINE_ROWS, HEADLINE_WIDTH = 8, 100  # the README's limits: rows of the table, columns of a line


def _device(d: Data) -> str:
    """The accelerator a file measured on (for a CPU-side measurement, the one its inputs were on)."""
    name = str(d.get("inputs_device") or d.get("device") or d.get("env", {}).get("device", "?"))
    return name.split(": ", 1)[-1].removeprefix("NVIDIA ").split(" ")[0]  # "H100 80GB HBM3" -> "H100"


def moe_headline(d: Data) -> list[Headline]:
    s = d["shape"]
    b = max((b for b in d["bench"] if b["heads"] == 3), key=lambda b: b["tokens"])
    native = b.get("native_graph", b["native"])  # graph against graph where the baseline was captured
    return [
        (
            f"MoE experts, T = {b['tokens']}, 3 x {s['E']} experts, top-{s['K']}",
            f"{_ms(b['fused_graph']['p50'])} ms",
            f"torch `_grouped_mm` {_ms(native['p50'])} ms",
        )
    ]


def attention_headline(d: Data) -> list[Headline]:
    name, v = list(d["long"].items())[-1]
    ms = {k: x["p50"] for k, x in v["event_ms"].items()}
    return [
        (
            f"attention + sink, {name}, {d['heads']} x {d['head_dim']}",
            f"{_ms(ms['resolved_sink'])} ms",
            f"FA3 + torch sink fix {_ms(ms['kernel_fa3_sink_torchfix'])} ms",
        )
    ]


def rmsnorm_headline(d: Data) -> list[Headline]:
    r = max(d["rows"], key=lambda r: len(r["modality_sizes"] or ()))
    res = {k: v["tb_s"] for k, v in r["results"].items()}
    m = len(r["modality_sizes"] or ()) or 1
    return [
        (
            f"RMSNorm, {r['shape'][0]} x {r['shape'][1]}, {m} modalities",
            f"{res['fused_triton']:.2f} TB/s",
            f"torch.compile {res['composite_compiled']:.2f} TB/s",
        )
    ]


def vllm_omni_headline(d: Data) -> list[Headline]:
    runs = [r for r in d["results"] if r["tokens"] == max(r["tokens"] for r in d["results"])]
    modes = " / ".join(r["mode"] for r in runs)
    return [
        (
            f"vllm-omni layer, T = {runs[0]['tokens']}, {modes}",
            " / ".join(f"{r['speedup']:.2f}x" for r in runs),
            "plugin off " + " / ".join(_ms(r["ms_per_layer"]["off"]["p50"]) for r in runs) + " ms",
        )
    ]


def dispatch_headline(d: Data) -> list[Headline]:
    worst = max(d["rows"], key=lambda r: r["added_us"])
    return [
        ("dispatch added per call, inputs on the GPU", f"<= {worst['added_us']:.1f} us", "a kernel called directly")
    ]


def dit_step_headline(d: Data) -> list[Headline]:
    form, runs = _dit_step(d)[0]
    return [
        (
            f"whole DiT step ({form}), " + " / ".join(m for m, _, _ in runs),
            " / ".join(f"{off / on:.2f}x" for _, on, off in runs),
            "plugin off " + " / ".join(_secs(off) for _, _, off in runs) + " s",
        )
    ]


# Which file gives each headline row, in the README's order. The whole-DiT-step row comes from
# dit_step_<device>.json when such a file exists (the first, by name) and is left out otherwise.
HEADLINES: tuple[tuple[str, Callable[[Data], list[Headline]]], ...] = (
    (MOE_BENCH, moe_headline),
    ("attention_h200_final.json", attention_headline),
    ("rmsnorm_h200.json", rmsnorm_headline),
    ("vllm_omni_stack_h100.json", vllm_omni_headline),
    ("dispatch_cuda_h100.json", dispatch_headline),
    # THE WHOLE DiT STEP: a row from benchmarks/results/dit_step_<device>.json once that benchmark has
    # landed (records with mode, plugin, form, s_per_step {p50, ...}); no such file, no row.
    (f"{DIT_STEP}*.json", dit_step_headline),
)


def headline_table(data: dict[str, Data]) -> str:
    """The README's table: one row per HEADLINES entry whose file is present (at most 8 rows)."""
    lines = list(HEADLINE_HEAD)
    for pattern, summarise in HEADLINES:
        names = sorted(n for n in data if fnmatch.fnmatch(n, pattern))
        if not names:
            continue
        try:
            rows = summarise(data[names[0]])
        except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError) as exc:
            rows = [(names[0], "-", f"not summarised: {type(exc).__name__}")]
        d = data[names[0]]
        on = _device(d) if isinstance(d, dict) else names[0].removeprefix(DIT_STEP).removesuffix(".json")
        lines += [f"| {what} | {ours} | {base} | {on} |" for what, ours, base in rows]
    return "\n".join(lines[: 2 + HEADLINE_ROWS])


def _summariser(name: str) -> Callable[[Data], list[Row]] | None:
    """The full table's summariser of a results file (the DiT step's files by their prefix)."""
    if name.startswith(DIT_STEP) and name.endswith(".json"):
        return dit_step_rows
    return SUMMARISERS.get(name)


def load(results: Path = RESULTS) -> tuple[dict[str, Data], list[str]]:
    """The summarised files' data, and one note per file that is not summarised (and why)."""
    data: dict[str, Data] = {}
    notes: list[str] = []
    for path in sorted(results.glob("*.json")):
        if path.name in SUPERSEDED:
            notes.append(f"`{path.name}`: an earlier run, superseded by `{SUPERSEDED[path.name]}`")
        elif path.name in DIAGNOSES:
            notes.append(f"`{path.name}`: {DIAGNOSES[path.name]}")
        elif _summariser(path.name) is None:
            notes.append(f"`{path.name}`: skipped, no summariser in benchmarks/report.py yet")
        else:
            try:
                data[path.name] = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                notes.append(f"`{path.name}`: skipped, unreadable ({exc})")
    return data, notes


def results_table(data: dict[str, Data], *, history: bool = False) -> str:
    """The current results (README), or with ``history`` the earlier runs' rows (docs/benchmarks.md)."""
    lines = ["| op | shape | magi2 (resolved) | baseline, same run | notes |", "| --- | --- | --- | --- | --- |"]
    names = [*SUMMARISERS, *sorted(n for n in data if n not in SUMMARISERS)]
    for name in names:
        summarise = _summariser(name)
        if name not in data or summarise is None or (name in HISTORY) != history:
            continue
        try:
            rows = summarise(data[name])
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:  # a changed schema: say so
            rows = [(name, "-", "-", "-", f"not summarised: {type(exc).__name__}: {exc}")]
        for op, shape, ours, base, notes in rows:
            lines.append(f"| {op} | {shape} | {ours} | {base} | {notes} (`{name}`) |")
    return "\n".join(lines)


def readme_table(readme: Path = README) -> str:
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme} has no {BEGIN} ... {END} section")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def write_readme(table: str, readme: Path = README) -> None:
    text = readme.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


# -- plots (matplotlib, imported only here) -------------------------------------------------------
def _plots(data: dict[str, Data]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "magi2", "figure.dpi": 100, "font.size": 9})
    IMG.mkdir(parents=True, exist_ok=True)
    made: list[tuple[str, str]] = []

    def save(fig: Any, name: str, caption: str) -> None:
        fig.tight_layout()
        fig.savefig(IMG / name, format="svg", metadata={"Date": None})
        plt.close(fig)
        made.append((name, caption))

    if MOE_BENCH in data:
        d = data[MOE_BENCH]
        bench = [b for b in d["bench"] if b["heads"] == 3]
        points = {b["tokens"]: (b["fused"]["p50"], b["native"]["p50"]) for b in bench}
        points.update({c["tokens"]: (c["fused_p50"], c["native_p50"]) for c in d.get("crossover", [])})
        t = sorted(points)
        fig, ax = plt.subplots(figsize=(6.4, 4))
        ax.plot(t, [points[x][0] for x in t], "o-", label="triton (fused, resolved)")
        ax.plot(t, [points[x][1] for x in t], "s-", label="torch _grouped_mm pipeline")
        ax.plot([b["tokens"] for b in bench], [b["eager"]["p50"] for b in bench], "^-", label="reference (eager)")
        floor_t, c = [b["tokens"] for b in bench], file_ceilings(d)
        if c and c.copy_tb_s:  # the floors at this device's ceilings (time = work / rate)
            ax.plot(floor_t, [b["weight_bytes"] / (c.copy_tb_s * 1e9) for b in bench], "k--", label="weight-read floor")
        if c and c.matmul_tflops:
            ax.plot(floor_t, [b["flops"] / (c.matmul_tflops * 1e9) for b in bench], "k:", label="matmul floor")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="tokens T",
            ylabel="ms per call (p50)",
            title=f"MoE experts, 3 heads x {d['shape']['E']} experts, {d['device']}",
        )
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        save(fig, "moe_time_vs_tokens.svg", "MoE experts: time per call against tokens, per provider, with the floors")

    steps = sorted(n for n in data if n.startswith(DIT_STEP) and isinstance(data[n], dict) and data[n].get("breakdown"))
    if steps:
        d = data[steps[0]]
        runs = [b for b in d["breakdown"] if b["mode"] in ("eager", "compiled")]
        cats = sorted(
            {c for b in runs for c in b["categories"]},
            key=lambda c: -max(b["categories"].get(c, {}).get("ms", 0.0) for b in runs),
        )
        fig, ax = plt.subplots(figsize=(9.5, 4.2))
        labels = [f"{b['mode']}\nplugin {b['plugin']}" for b in runs]
        bottom = [0.0] * len(runs)
        for i, c in enumerate(cats):
            ms = [b["categories"].get(c, {}).get("ms", 0.0) / 1e3 for b in runs]
            ax.bar(labels, ms, 0.6, bottom=bottom, label=c, color=plt.get_cmap("tab20")(i % 20))
            bottom = [x + y for x, y in zip(bottom, ms, strict=True)]
        ax.set(ylabel="kernel seconds per step", title=f"one MAGI-2 DiT step, 272p / 10 s, {d['device']}")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
        save(fig, "dit_step_breakdown.svg", "The whole DiT step: kernel time per operator, plugin off and on, per mode")

    if "attention_h200_final.json" in data:
        d = data["attention_h200_final.json"]
        shapes = {**d["long"], **d["short"]}
        names = list(shapes)
        sink = [v["event_ms"]["resolved_sink"]["p50"] / v["event_ms"]["raw_fa3"]["p50"] for v in shapes.values()]
        nosink = [
            v["event_ms"]["resolved_nosink"]["p50"]
            / min(v["event_ms"]["raw_fa3"]["p50"], v["event_ms"]["raw_varlen"]["p50"])
            if "resolved_nosink" in v["event_ms"]
            else float("nan")
            for v in shapes.values()
        ]
        fig, ax = plt.subplots(figsize=(9, 3.8))
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], sink, 0.4, label="with a sink: resolved / raw FA3 (no sink)")
        ax.bar([x + 0.2 for x in xs], nosink, 0.4, label="no sink: resolved / fastest raw kernel")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(xs), names, rotation=60, fontsize=7)
        ax.set(ylabel="time ratio (p50, 1 = raw kernel)", title=f"attention, resolved call / raw kernel, {d['device']}")
        ax.legend(fontsize=8)
        save(fig, "attention_resolved_over_raw.svg", "Attention: the resolved call's time over the raw kernel's")

    if "rmsnorm_h200.json" in data:
        d = data["rmsnorm_h200.json"]
        rows = d["rows"]
        fig, ax = plt.subplots(figsize=(7, 3.8))
        kinds = [
            ("fused_triton", "triton (fused)"),
            ("composite_compiled", "torch.compile composite"),
            ("composite_eager", "eager composite"),
        ]
        for i, (key, label) in enumerate(kinds):
            ax.bar(
                [x + (i - 1) * 0.27 for x in range(len(rows))],
                [r["results"][key]["tb_s"] for r in rows],
                0.27,
                label=label,
            )
        copy = _copy_tb_s(d)
        if copy:
            ax.axhline(copy, color="k", ls="--", label="device copy")
            ax.set_ylim(0, 1.35 * copy)  # room for the legend above the bars
        ax.set_xticks(range(len(rows)), [r["name"] for r in rows], fontsize=7, rotation=15)
        ax.set(ylabel="TB/s (read + write)", title=f"RMSNorm bandwidth against copy, {d['env']['device']}")
        ax.legend(fontsize=8, ncol=2, loc="upper center")
        save(fig, "rmsnorm_bandwidth.svg", "RMSNorm: achieved bandwidth against the device copy")

    if "moe_sweep_h200.json" in data:
        d = data["moe_sweep_h200.json"]
        shapes = sorted(_sweep_shapes(d).items(), key=lambda kv: (kv[0][1], kv[0][0]))
        names = list(dict.fromkeys(n for _, s in shapes for n in s["variants"]))
        fig, ax = plt.subplots(figsize=(8, 3.8))
        w = 0.8 / len(names)
        for i, n in enumerate(names):
            xs = [j for j, (_, s) in enumerate(shapes) if n in s["variants"]]
            ax.bar(
                [x + (i - (len(names) - 1) / 2) * w for x in xs],
                [shapes[j][1]["variants"][n]["graph_speedup_vs_base"] for j in xs],
                w,
                label="pointer (base)" if n == "base" else n,
            )
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(shapes)), [f"T={t}, {h} heads" for (t, h), _ in shapes])
        ax.set(
            ylabel="speed-up over the pointer kernel (graph p50)",
            ylim=(0.5, 1.25),
            title=f"MoE one-kernel variants, {d['device']}",
        )
        ax.legend(fontsize=7, ncol=4, loc="upper center")
        save(fig, "moe_variant_sweep.svg", "MoE kernel variants: graph-p50 speed-up over the pointer kernel")

    if "block_h200.json" in data:
        d = data["block_h200.json"]
        packs = d["packs"]
        kinds = [
            ("eager", "magi2 eager"),
            ("compile", "magi2 compile"),
            ("graph", "magi2 CUDA graph"),
            ("baseline_eager", "user stack eager"),
            ("baseline_graph", "user stack graph"),
        ]
        fig, ax = plt.subplots(figsize=(7, 3.8))
        w = 0.8 / (len(kinds) + 1)
        for i, (key, label) in enumerate(kinds):
            ax.bar(
                [x + (i - len(kinds) / 2) * w for x in range(len(packs))],
                [p["block_ms"][key]["p50"] for p in packs.values()],
                w,
                label=label,
            )
        ax.bar(
            [x + (len(kinds) / 2) * w for x in range(len(packs))],
            [p["ops"]["magi2_stack_sum_ms"] for p in packs.values()],
            w,
            label="magi2 ops alone, summed",
            color="grey",
        )
        ax.set_xticks(range(len(packs)), [f"[{'/'.join(map(str, p['segments']))}]" for p in packs.values()])
        ax.set(ylabel="ms per 4-layer stack (p50)", title=f"MAGI-2 block stack, {d['env']['device']}")
        ax.set_ylim(0, 1.4 * max(p["block_ms"]["baseline_eager"]["p50"] for p in packs.values()))
        ax.legend(fontsize=7, ncol=3, loc="upper center")
        save(fig, "block_stack.svg", "MAGI-2 block stack: magi2 modes against the user's baseline stack")
    return made


# docs/benchmarks.md's hand-written part (what was measured, on which commit, what was not run):
# kept as it is between these markers when the rest of the page is regenerated.
NOTES_BEGIN, NOTES_END = "<!-- notes:begin -->", "<!-- notes:end -->"


def doc_notes(doc: Path = DOC) -> str:
    text = doc.read_text() if doc.exists() else ""
    if NOTES_BEGIN not in text or NOTES_END not in text:
        return ""
    return text.split(NOTES_BEGIN, 1)[1].split(NOTES_END, 1)[0].strip("\n")


def write_doc(table: str, history: str, notes: list[str], plots: list[tuple[str, str]], doc: Path = DOC) -> None:
    parts = [
        "# Benchmarks",
        "",
        "Generated by `python -m benchmarks.report` from `benchmarks/results/*.json`, except the part",
        "between the notes markers, which is written by hand and kept. Each file records its device,",
        "versions and commit; the method is in each benchmark's docstring and in the notes",
        "(`docs/moe-notes.md`, `docs/fa3-notes.md`, `docs/rmsnorm-notes.md`).",
        "",
        NOTES_BEGIN,
        doc_notes(doc),
        NOTES_END,
        "",
    ]
    for name, caption in plots:
        parts += [f"## {caption}", "", f"![{caption}](img/{name})", ""]
    parts += ["## Current results (the README's headline rows come from these files)", "", table, ""]
    parts += [
        "## Earlier runs",
        "",
        "Sweeps and analyses of kernels that the H200 table has since replaced (CHANGELOG.md says what each decided):",
        "",
    ]
    parts += [f"- `{name}`: {why}" for name, why in HISTORY.items()] + ["", history, ""]
    parts += ["## Files not in the tables", ""]
    parts += [f"- {n}" for n in notes] or ["- none"]
    doc.write_text("\n".join(parts) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare README's table with the JSON")
    args = ap.parse_args(argv)
    data, notes = load()
    headline = headline_table(data)
    if args.check:
        if readme_table() != headline:
            print("README's results table differs from benchmarks/results/*.json; run python -m benchmarks.report")
            return 1
        return 0
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    write_readme(headline)
    write_doc(results_table(data), results_table(data, history=True), notes, _plots(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
