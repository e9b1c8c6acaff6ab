"""FlashAttention-4 against FA3 on the H200, with and without a sink, plus FA4's JIT cost.

One run puts side by side, for each shape (24 heads x 128, bf16, non-causal, one FP32 sink row):

* ``resolved_sink`` / ``resolved_nosink``: ``magi2_core.attention`` as resolved (the profile applies);
* ``raw_fa3``: FA3's varlen without a sink, the baseline the ratios divide by;
* ``fa3_fused_sink``: the fa3 kernel object with the sink = FA3 + the fused Triton correction;
* ``raw_fa4_sink`` / ``raw_fa4``: FA4's varlen with ``learnable_sink = Ls`` / without a sink;
* ``fa4_sink``: the fa4 kernel object with the sink (the ``Ls`` reduction + FA4);
* ``api_fa3_sink`` / ``api_fa4_sink``: the same through ``magi2_core.attention(provider=...)`` with
  no rules (``*_norules``), so both pay the same validation and dispatch;
* short shapes also ``raw_varlen`` (torch's ``varlen_attn``), the target of the short-work preferences.

Shapes: long packs [32768], [8192]x4, [14601]x2; short packs 16x256, 8x1024, 2x2048; single segments
[342], [1024], [2048], [4096], [8192]. Timing as in ``benchmarks/attention.py``: ``event`` (one call,
L2 flushed before it) and ``loop`` (``LOOP`` back-to-back calls), variants alternating in one run.
``jit`` records, per FA4 configuration, the first call in this process (compile included, or a load
from FA4's persistent cache when ``FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1``) and the cached call.

    python -m benchmarks.attention_fa4 [--quick] [--out benchmarks/results/attention_fa4_h200.json]

The device-profile preferences this re-measures (magi2_core/profiles/nvidia-h200.json):
``h200-fa4-sink-*`` (FA4's native sink preferred on short packs) and ``h200-short-work-*`` (torch
varlen preferred on small sink-free work); ``preferences`` in the results lists the active profile's
attention rows.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch

import magi2_core as m2
from benchmarks._common import stats, time_alternating, time_loop
from benchmarks.attention import LOOP, rel_l2
from magi2_core.selection.registry import get_registry
from magi2_core.sink_correction.reference import sink_correction
from magi2_core.testing import call_record

H, D = 24, 128
OUT = "benchmarks/results/attention_fa4_h200.json"
LONG = {"32768": [32768], "8192x4": [8192] * 4, "14601x2": [14601] * 2}
SHORT = {"16x256": [256] * 16, "8x1024": [1024] * 8, "2x2048": [2048] * 2}
SINGLE = {"342": [342], "1024": [1024], "2048": [2048], "4096": [4096], "8192": [8192]}
JIT_SHAPE = [4096]
ENV_KEYS = ("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "CUTE_DSL_CACHE_DIR")


def ensure_backends() -> None:
    """Register reference, FA3 and FA4 when on the path but not pip-installed, plus ``fa3_norules`` and
    ``fa4_norules``: the same kernels at priority -1 (never chosen by priority) with no rules, so the
    public API can time each where the profile sends the resolved call elsewhere (the names match the
    earlier results, from when the speed rules lived in the descriptors)."""
    import magi2_backend_cuda_fa3.plugin as fa3_plugin
    import magi2_backend_cuda_fa4.plugin as fa4_plugin
    import magi2_backend_reference.plugin as ref_plugin

    reg = get_registry()
    for name, plugin, provider in (
        ("reference", ref_plugin, "reference"),
        ("cuda_fa3", fa3_plugin, "fa3"),
        ("cuda_fa4", fa4_plugin, "fa4"),
    ):
        if reg.provider("attention", provider) is None:
            reg.register(plugin, name=name)
    unruled = []
    for provider in ("fa3", "fa4"):
        loaded = reg.provider("attention", provider)
        assert loaded is not None
        unruled.append(
            loaded.capability.model_copy(
                update={"name": f"{provider}_norules", "rules": (), "priority": -1, "backend": ""}
            )
        )

    class NoRules:
        def magi2_backend(self) -> m2.BackendSpec:
            return m2.BackendSpec(name="bench-fa-norules", version="0", core_api=">=2.0,<3", providers=tuple(unruled))

    reg.register(NoRules(), name="bench_fa_norules")


def _inputs(lengths: list[int], seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = sum(lengths)
    q, k, v = (torch.randn(t, H, D, device="cuda", generator=g).bfloat16() for _ in range(3))
    sink = (torch.randn(1, H, device="cuda", generator=g) + 4.0).float()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return q, k, v, sink, cu


def _timed(fn: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def jit_costs(cached_reps: int) -> dict[str, Any]:
    """First call per FA4 configuration in this process, then the cached call (seconds / ms)."""
    from magi2_backend_cuda_fa4.native_sinks import native_sink
    from magi2_backend_cuda_fa4.provider import fa4_attention

    t0 = time.perf_counter()
    abi = fa4_attention.loaded.abi  # imports flash_attn.cute (the CuTe DSL)
    import_s = time.perf_counter() - t0
    assert abi is not None, fa4_attention.loaded.why_none()
    q, k, v, sink, cu = _inputs(JIT_SHAPE, 1)
    mx = max(JIT_SHAPE)
    ls = native_sink(sink).logit
    out: dict[str, Any] = {"import_s": import_s, "shape": JIT_SHAPE}
    for name, with_sink, lse in (
        ("sink", True, False),
        ("nosink", False, False),
        ("sink_lse", True, True),
        ("nosink_lse", False, True),
    ):

        def call(with_sink: bool = with_sink, lse: bool = lse) -> Any:
            return abi.varlen(
                q=q,
                k=k,
                v=v,
                cu_seqlens_q=cu,
                cu_seqlens_k=cu,
                max_seqlen_q=mx,
                max_seqlen_k=mx,
                softmax_scale=D**-0.5,
                causal=False,
                softcap=0.0,
                learnable_sink=ls if with_sink else None,
                num_splits=1,
                return_lse=lse,
            )

        first = _timed(call)
        cached = [_timed(call) * 1e3 for _ in range(cached_reps)]
        out[name] = {"first_call_s": first, "cached_call_ms": statistics.median(cached)}
    return out


def case(lengths: list[int], reps: int, loop_reps: int, seed: int, short: bool) -> dict[str, Any]:
    from magi2_backend_cuda_fa3.provider import fa3_attention
    from magi2_backend_cuda_fa4.native_sinks import native_sink
    from magi2_backend_cuda_fa4.provider import fa4_attention

    q, k, v, sink, cu = _inputs(lengths, seed)
    mx = max(lengths)
    scale = D**-0.5
    fa3, fa4 = fa3_attention.loaded.abi, fa4_attention.loaded.abi
    assert fa3 is not None and fa4 is not None
    ls = native_sink(sink).logit
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
    common = {
        "q": q,
        "k": k,
        "v": v,
        "cu_seqlens_q": cu,
        "cu_seqlens_k": cu,
        "max_seqlen_q": mx,
        "max_seqlen_k": mx,
        "softmax_scale": scale,
        "causal": False,
    }

    def api(sinks: torch.Tensor | None, provider: str | None = None) -> Callable[[], Any]:
        return lambda: m2.attention(q, k, v, cu, cu, max_seqlen_q=mx, max_seqlen_k=mx, sinks=sinks, provider=provider)

    def resolution(sinks: torch.Tensor | None) -> dict[str, Any]:
        res = m2.resolve("attention", q, k, v, cu, cu, max_seqlen_q=mx, max_seqlen_k=mx, sinks=sinks)
        rejected = {c.provider: [str(r) for r in c.reasons] for c in res.candidates if c.verdict.value == "rejected"}
        return {"chosen": res.chosen, "rejected": rejected}

    record = call_record("attention", q, k, v, cu, cu, **kw)  # what the kernel objects receive, built once
    fns: dict[str, Callable[[], Any]] = {
        "resolved_sink": api(sink),
        "resolved_nosink": api(None),
        "raw_fa3": lambda: fa3.varlen(**common),
        "fa3_fused_sink": lambda: fa3_attention(record),
        "api_fa3_sink": api(sink, "fa3_norules"),
        "raw_fa4_sink": lambda: fa4.varlen(**common, softcap=0.0, learnable_sink=ls, num_splits=1, return_lse=False),
        "raw_fa4": lambda: fa4.varlen(**common, softcap=0.0, learnable_sink=None, num_splits=1, return_lse=False),
        "fa4_sink": lambda: fa4_attention(record),
        "api_fa4_sink": api(sink, "fa4_norules"),
    }
    if short and get_registry().provider("attention", "torch_varlen") is not None:
        from torch.nn.attention.varlen import varlen_attn

        fns["raw_varlen"] = lambda: varlen_attn(q, k, v, cu, cu, mx, mx, scale=scale)
    for fn in fns.values():  # warm-up: every compile (FA4 JIT, Triton) and cache fill happens here
        fn()
        fn()
    torch.cuda.synchronize()
    # correctness in the same run: against raw FA3 + the torch FP32 correction
    o_raw, lse_raw = fa3.varlen(**common, **{fa3.lse_flag: True})[:2]
    o_ref, lse_ref = sink_correction(o_raw, lse_raw, sink, rescale="fp32")
    o_fa4, lse_fa4 = fa4_attention(call_record("attention", q, k, v, cu, cu, **{**kw, "return_lse": True}))
    assert lse_fa4 is not None
    correctness = {
        "fa4_sink_vs_fa3_plus_fp32_correction_rel_l2": rel_l2(o_fa4, o_ref),
        "fa4_lse_vs_logaddexp_max_abs": float((lse_fa4 - lse_ref).abs().max()),
        "resolved_sink_vs_fa3_plus_fp32_correction_rel_l2": rel_l2(fns["resolved_sink"](), o_ref),
    }
    ev = time_alternating(fns, reps, warmup=1)
    lp = time_loop(fns, loop_reps, LOOP)
    out: dict[str, Any] = {
        "segments": lengths if len(lengths) <= 8 else f"{len(lengths)}x{lengths[0]}",
        "tokens": sum(lengths),
        "resolution_sink": resolution(sink),
        "resolution_nosink": resolution(None),
        "correctness": correctness,
        "event_ms": {n: stats(x) for n, x in ev.items()},
        "loop_ms": {n: stats(x) for n, x in lp.items()},
    }
    for timing in ("event_ms", "loop_ms"):
        p50 = {n: s["p50"] for n, s in out[timing].items()}
        out[f"over_raw_fa3_{timing}"] = {n: t / p50["raw_fa3"] for n, t in p50.items()}
        # the choice the fa4-sink preferences make: FA4's native sink vs FA3 + the fused correction
        best = "fa4_sink" if p50["fa4_sink"] < p50["fa3_fused_sink"] else "fa3_fused_sink"
        picked = "fa4_sink" if out["resolution_sink"]["chosen"] == "fa4" else "fa3_fused_sink"
        out[f"sink_winner_{timing}"] = {
            "best": best,
            "resolved": picked,
            "fa4_over_fa3_fused": p50["fa4_sink"] / p50["fa3_fused_sink"],
        }
    return out


def _commit() -> str:
    for var in ("MAGI2_GIT_COMMIT", "GIT_COMMIT"):  # scripts/gpu_session.sh sets the first
        if os.environ.get(var, "unknown") != "unknown":
            return os.environ[var]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description="FA4 vs FA3 with and without a sink, and FA4's JIT cost")
    ap.add_argument("--out", default=OUT)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="fewer repetitions (meant to finish within 4 minutes on an H200, JIT included)",
    )
    ap.add_argument("--jit-only", action="store_true", help="only the first-call / cached-call JIT costs")
    args = ap.parse_args()
    ensure_backends()
    from magi2_backend_cuda_fa3.provider import fa3_attention
    from magi2_backend_cuda_fa4.discovery import dist_version

    from magi2_core.profiles import active_profile

    t0 = time.time()
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "compute_capability": list(torch.cuda.get_device_capability()),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "flash_attn_4": dist_version("flash-attn-4"),
        "nvidia_cutlass_dsl": dist_version("nvidia-cutlass-dsl"),
        "fa3_build": fa3_attention.loaded.abi.label if fa3_attention.loaded.abi else fa3_attention.loaded.why_none(),
        "sink_correction": fa3_attention.sink_correction.name,
        "git_commit": _commit(),
        "env": {key: os.environ.get(key) for key in ENV_KEYS},
        "heads": H,
        "head_dim": D,
        "dtype": "bfloat16",
        "profile": active_profile("cuda").note.model_dump(mode="json"),
        "preferences": [
            r.model_dump(mode="json") for r in active_profile("cuda").profile.preferences if r.op == "attention"
        ],
        "jit": jit_costs(5),
    }
    if not args.jit_only:
        reps, loop_reps = (8, 2) if args.quick else (16, 4)
        short_reps, short_loops = (20, 4) if args.quick else (40, 8)
        results["long"] = {n: case(x, reps, loop_reps, 100 + i, short=False) for i, (n, x) in enumerate(LONG.items())}
        results["short"] = {
            n: case(x, short_reps, short_loops, 200 + i, short=True) for i, (n, x) in enumerate(SHORT.items())
        }
        results["single"] = {
            n: case(x, short_reps, short_loops, 300 + i, short=True) for i, (n, x) in enumerate(SINGLE.items())
        }
    results["seconds"] = time.time() - t0
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=1)
    report(results)


def report(results: dict[str, Any]) -> None:
    print(
        f"device {results['device']}; flash-attn-4 {results['flash_attn_4']}; fa3 {results['fa3_build']}; "
        f"correction {results['sink_correction']}; {results['seconds']:.0f} s"
    )
    jit = results["jit"]
    print(
        f"FA4 import {jit['import_s']:.2f} s; first call / cached call at {jit['shape']}: "
        + "; ".join(
            f"{n} {v['first_call_s']:.2f} s / {v['cached_call_ms']:.3f} ms"
            for n, v in jit.items()
            if isinstance(v, dict)
        )
    )
    cols = (
        "resolved_sink",
        "fa3_fused_sink",
        "fa4_sink",
        "raw_fa4_sink",
        "raw_fa3",
        "raw_fa4",
        "resolved_nosink",
        "raw_varlen",
    )
    for section in ("long", "short", "single"):
        if section not in results:
            continue
        print(f"[{section}] p50 ms, event (L2 flushed) / loop; chosen with/without sink; time / raw FA3 (event)")
        print(f"{'shape':>9} {'chosen':>18} | " + " ".join(f"{c[:14]:>15}" for c in cols))
        for name, r in results[section].items():
            cells = [
                f"{r['event_ms'][c]['p50']:7.3f}/{r['loop_ms'][c]['p50']:7.3f}" if c in r["event_ms"] else f"{'-':>15}"
                for c in cols
            ]
            chosen = f"{r['resolution_sink']['chosen']}/{r['resolution_nosink']['chosen']}"
            ratio = r["over_raw_fa3_event_ms"]
            win = r["sink_winner_event_ms"]
            print(f"{name:>9} {chosen:>18} | " + " ".join(cells))
            print(
                f"{'':>9} {'':>18} | fa4_sink {ratio['fa4_sink']:.3f}, fa3_fused_sink {ratio['fa3_fused_sink']:.3f}, "
                f"resolved {ratio['resolved_sink']:.3f}; sink winner {win['best']} (resolved {win['resolved']}); "
                f"fa4 rel-L2 {r['correctness']['fa4_sink_vs_fa3_plus_fp32_correction_rel_l2']:.1e}"
            )


if __name__ == "__main__":
    main()
