"""MAGI-2 attention on the H200: resolved ``magi2_core.attention`` (one sink) vs raw FA3 vs torch varlen.

MAGI-2 shapes: 24 heads x 128, bf16, non-causal, segments [32768], [8192]x4, [14601]x2, plus a
short-sequence sweep (single segments and many tiny ones) that locates the crossover where torch's
own ``varlen_attn`` (provider ``torch_varlen``) beats FA3: the short-work preferences of the H200 profile.

Two timings per variant, calls alternating between variants in the same run:
* ``event``: device events around one call, a 256 MiB buffer zeroed before each (L2 flush, outside
  the timed region). The flush also lets the host run ahead, so this is close to GPU time.
* ``loop``: events around ``LOOP`` back-to-back calls, divided by ``LOOP``: the steady per-call cost
  of an eager model, host overhead included when the host is the bottleneck (tiny problems).
TFLOP/s counts 4·Lq·Lk·H·D per segment; its fraction is of this device's dense BF16 matmul rate,
measured in the same run (``_common.measure_ceilings``, the file's "ceilings").

    PYTHONPATH=... python -m benchmarks.attention --out results.json [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import torch

import magi2_core as m2
from benchmarks._common import Ceilings, env_record, measure_ceilings, stats, time_alternating, time_loop
from magi2_core.selection.registry import get_registry
from magi2_core.sink_correction.reference import sink_correction
from magi2_core.testing import call_record

H, D = 24, 128
LOOP = 20
LONG = {"32768": [32768], "8192x4": [8192] * 4, "14601x2": [14601] * 2}
SHORT = {
    "64": [64],
    "128": [128],
    "256": [256],
    "37+300+5": [37, 300, 5],
    "512": [512],
    "768": [768],
    "1024": [1024],
    "1536": [1536],
    "2048": [2048],
    "4096": [4096],
    "8x64": [64] * 8,
    "32x128": [128] * 32,
    "64x64": [64] * 64,
    "16x256": [256] * 16,
    "4x512": [512] * 4,
    "2x1024": [1024] * 2,
    "64x128": [128] * 64,
    "256x64": [64] * 256,
    "8x1024": [1024] * 8,
    "4x2048": [2048] * 4,
}


def ensure_backends() -> None:
    """Register the reference and FA3 backends when they are on the path but not pip-installed, plus
    ``fa3_norules``: the same kernel at priority -1 (never chosen by priority) with no rules, so the
    public API times FA3 where the profile sends the resolved call elsewhere (the name matches the
    earlier results, from when the short-work rules lived in FA3's descriptor)."""
    import magi2_backend_cuda_fa3.plugin as fa3_plugin
    import magi2_backend_reference.plugin as ref_plugin

    reg = get_registry()
    if reg.provider("attention", "reference") is None:
        reg.register(ref_plugin, name="reference")
    if reg.provider("attention", "fa3") is None:
        reg.register(fa3_plugin, name="cuda_fa3")
    fa3 = reg.provider("attention", "fa3")
    assert fa3 is not None
    unruled = fa3.capability.model_copy(update={"name": "fa3_norules", "rules": (), "priority": -1, "backend": ""})

    class NoRules:
        def magi2_backend(self) -> m2.BackendSpec:
            return m2.BackendSpec(name="bench-fa3-norules", version="0", core_api=">=2.0,<3", providers=(unruled,))

    reg.register(NoRules(), name="bench_fa3_norules")


def flops(lengths: list[int]) -> float:
    return float(sum(4 * n * n * H * D for n in lengths))


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def case(lengths: list[int], reps: int, loop_reps: int, seed: int, nosink: bool, ceilings: Ceilings) -> dict[str, Any]:
    from magi2_backend_cuda_fa3.provider import FA3Attention, fa3_attention

    from magi2_core.sink_correction.choice import torch_correction

    g = torch.Generator(device="cuda").manual_seed(seed)
    t = sum(lengths)
    q, k, v = (torch.randn(t, H, D, device="cuda", generator=g).bfloat16() for _ in range(3))
    sink = (torch.randn(1, H, device="cuda", generator=g) + 4.0).float()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    mx = max(lengths)
    scale = D**-0.5
    abi = fa3_attention.loaded.abi
    assert abi is not None, fa3_attention.loaded.why_none()
    fa3_torchfix = FA3Attention(correction=lambda: torch_correction("benchmark: torch correction"))
    kw: dict[str, Any] = {
        "max_seqlen_q": mx,
        "max_seqlen_k": mx,
        "softmax_scale": scale,
        "softcap": 0.0,
        "sinks": sink,
        "sink_rescale": "fp32",
        "deterministic": False,
        "return_lse": False,
    }

    def api(sinks: torch.Tensor | None, provider: str | None = None) -> Callable[[], Any]:
        return lambda: m2.attention(q, k, v, cu, cu, max_seqlen_q=mx, max_seqlen_k=mx, sinks=sinks, provider=provider)

    def resolution(sinks: torch.Tensor | None) -> dict[str, Any]:
        res = m2.resolve("attention", q, k, v, cu, cu, max_seqlen_q=mx, max_seqlen_k=mx, sinks=sinks)
        fa3 = next(c for c in res.candidates if c.provider == "fa3")
        return {"chosen": res.chosen, "fa3_reasons": [str(r) for r in fa3.reasons]}

    res_sink = resolution(sink)
    record = call_record("attention", q, k, v, cu, cu, **kw)  # what the kernel object receives, built once
    fns: dict[str, Callable[[], Any]] = {
        "resolved_sink": api(sink),
        "api_fa3_sink": api(sink, "fa3_norules"),
        "raw_fa3": lambda: abi.varlen(
            q=q,
            k=k,
            v=v,
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,
            max_seqlen_q=mx,
            max_seqlen_k=mx,
            softmax_scale=scale,
            causal=False,
        ),
        "kernel_fa3_sink": lambda: fa3_attention(record),
        "kernel_fa3_sink_torchfix": lambda: fa3_torchfix(record),
    }
    varlen_ok = get_registry().provider("attention", "torch_varlen") is not None
    if varlen_ok:
        fns["api_torch_varlen_sink"] = api(sink, "torch_varlen")
        from torch.nn.attention.varlen import varlen_attn

        fns["raw_varlen"] = lambda: varlen_attn(q, k, v, cu, cu, mx, mx, scale=scale)
    res_nosink = None
    if nosink:
        res_nosink = resolution(None)
        fns["resolved_nosink"] = api(None)
        fns["api_fa3_nosink"] = api(None, "fa3_norules")
        if varlen_ok:
            fns["api_torch_varlen_nosink"] = api(None, "torch_varlen")
    for fn in fns.values():  # warm-up: compile Triton, load modules, fill caches
        fn()
        fn()
    torch.cuda.synchronize()
    # correctness in the same run: the resolved result against raw FA3 + the torch reference correction
    o_res = fns["resolved_sink"]()
    o_raw, lse_raw = abi.varlen(
        q=q,
        k=k,
        v=v,
        cu_seqlens_q=cu,
        cu_seqlens_k=cu,
        max_seqlen_q=mx,
        max_seqlen_k=mx,
        softmax_scale=scale,
        causal=False,
        **{abi.lse_flag: True},
    )[:2]
    o_ref, _ = sink_correction(o_raw, lse_raw, sink, rescale="fp32")
    ev = time_alternating(fns, reps, warmup=0)
    lp = time_loop(fns, loop_reps, LOOP)
    f = flops(lengths)
    out: dict[str, Any] = {
        "segments": lengths if len(lengths) <= 8 else f"{len(lengths)}x{lengths[0]}",
        "tokens": t,
        "flops": f,
        "resolution_sink": res_sink,
        "resolution_nosink": res_nosink,
        "resolved_vs_fa3_plus_reference_correction_rel_l2": rel_l2(o_res, o_ref),
        "event_ms": {n: stats(v) for n, v in ev.items()},
        "loop_ms": {n: stats(v) for n, v in lp.items()},
    }
    out["tflops_event_p50"] = {n: f / (s["p50"] * 1e-3) / 1e12 for n, s in out["event_ms"].items()}
    out["fraction_of_matmul_ceiling"] = {n: x / ceilings.matmul_tflops for n, x in out["tflops_event_p50"].items()}
    # resolved vs the fastest provider through the same public API (same validation/dispatch cost)
    for mode in ("sink", "nosink") if nosink else ("sink",):
        for timing in ("event_ms", "loop_ms"):
            provs = {n: s["p50"] for n, s in out[timing].items() if n.startswith("api_") and n.endswith(f"_{mode}")}
            best = min(provs, key=lambda n: provs[n])
            out[f"resolved_over_best_{mode}_{timing}"] = {
                "best": best,
                "ratio": out[timing][f"resolved_{mode}"]["p50"] / provs[best],
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="attention_h200.json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    ensure_backends()
    from magi2_backend_cuda_fa3.provider import fa3_attention

    from magi2_core.profiles import active_profile

    t0 = time.time()
    ceilings = measure_ceilings()
    results: dict[str, Any] = {
        **env_record(),
        "ceilings": ceilings.record(),
        "fa3_build": fa3_attention.loaded.abi.label if fa3_attention.loaded.abi else fa3_attention.loaded.why_none(),
        "sink_correction": fa3_attention.sink_correction.name,
        "sink_correction_detail": fa3_attention.sink_correction.detail,
        "profile": active_profile("cuda").note.model_dump(mode="json"),
        "preferences": [
            r.model_dump(mode="json") for r in active_profile("cuda").profile.preferences if r.op == "attention"
        ],
        "heads": H,
        "head_dim": D,
        "dtype": "bfloat16",
        "loop_calls": LOOP,
        "long": {},
        "short": {},
    }
    for i, (name, lengths) in enumerate(LONG.items()):
        results["long"][name] = case(
            lengths, 10 if args.quick else 20, 2, seed=100 + i, nosink=False, ceilings=ceilings
        )
    for i, (name, lengths) in enumerate(SHORT.items()):
        results["short"][name] = case(
            lengths, 20 if args.quick else 40, 6 if args.quick else 10, seed=200 + i, nosink=True, ceilings=ceilings
        )
    results["seconds"] = time.time() - t0
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    print(
        f"device {results['device']}; fa3 {results['fa3_build']}; correction {results['sink_correction']}; "
        f"this device's matmul {ceilings.matmul_tflops:.0f} TFLOP/s, measured in this run"
    )
    cols = (
        "resolved_sink",
        "api_fa3_sink",
        "api_torch_varlen_sink",
        "kernel_fa3_sink",
        "kernel_fa3_sink_torchfix",
        "raw_fa3",
        "raw_varlen",
        "resolved_nosink",
        "api_fa3_nosink",
        "api_torch_varlen_nosink",
    )
    for section in ("long", "short"):
        print(f"[{section}] p50 ms, event (L2 flushed) / loop ({LOOP} back-to-back calls)")
        print(f"{'shape':>9} {'chosen s/ns':>25} | " + " ".join(f"{c[:15]:>15}" for c in cols))
        for name, r in results[section].items():
            cells = [
                f"{r['event_ms'][c]['p50']:7.3f}/{r['loop_ms'][c]['p50']:7.3f}" if c in r["event_ms"] else f"{'-':>15}"
                for c in cols
            ]
            chosen = f"{r['resolution_sink']['chosen']}/{(r['resolution_nosink'] or {}).get('chosen', '-')}"
            print(f"{name:>9} {chosen:>25} | " + " ".join(cells))
    print("resolved / fastest provider through the API (p50 ratio: event, loop)")
    for name, r in results["short"].items():
        parts = [
            f"{m}: {r[f'resolved_over_best_{m}_event_ms']['ratio']:.3f}, "
            f"{r[f'resolved_over_best_{m}_loop_ms']['ratio']:.3f}"
            f" (best {r[f'resolved_over_best_{m}_loop_ms']['best']})"
            for m in ("sink", "nosink")
        ]
        print(f"{name:>9}: " + "; ".join(parts))
    for name, r in results["long"].items():
        tf = r["tflops_event_p50"]
        frac = r["fraction_of_matmul_ceiling"]["resolved_sink"]
        print(
            f"{name}: resolved {tf['resolved_sink']:.0f} TFLOP/s ({frac:.2f} of this device's matmul), raw FA3 "
            f"{tf['raw_fa3']:.0f}; resolved/raw {tf['resolved_sink'] / tf['raw_fa3']:.3f}; rel-L2 "
            f"{r['resolved_vs_fa3_plus_reference_correction_rel_l2']:.2e}"
        )


if __name__ == "__main__":
    main()
