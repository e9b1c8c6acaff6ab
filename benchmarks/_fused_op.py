"""What the fused-op benchmarks share (``mhc.py``, ``qk_norm_rope.py``, ``output_gate.py``): timing each
variant on the minimum bytes, and the command line that writes the record and prints it against the
device's copy."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks._common import env_record, measure_ceilings, stats, time_alternating

__all__ = ["main", "record", "time_variants"]


def time_variants(
    fns: dict[str, Callable[[], object]], iters: int, minimum_bytes: int, device: str
) -> dict[str, dict[str, float]]:
    """Each variant alternating call by call (L2 flushed, device events): p10/p50/p90 and TB/s on the
    minimum bytes."""
    results = {}
    for name, samples in time_alternating(fns, iters, device=device).items():
        st = stats(samples)
        results[name] = {
            "p10_ms": st["p10"],
            "p50_ms": st["p50"],
            "p90_ms": st["p90"],
            "tb_s_minimum_bytes": minimum_bytes / (st["p50"] * 1e-3) / 1e12,
        }
    return results


def record(
    tokens: int, sizes: list[int], minimum_bytes: int, verdicts: list[str], results: dict[str, Any], **shape: int
) -> dict[str, Any]:
    """The file's one row: the pack (tokens, ``shape``'s widths, modality sizes), the minimum bytes, the
    contract's verdicts and each variant's timing."""
    return {
        "tokens": tokens,
        **shape,
        "modality_sizes": sizes,
        "minimum_bytes": minimum_bytes,
        "acceptance": verdicts,
        "results": results,
    }


def main(name: str, doc: str, bench: Callable[..., dict[str, Any]], pack_tokens: int, *, wheel: bool = False) -> None:
    """``--iters/--tokens/--json/--smoke`` (and ``--wheel`` where ``wheel``: vllm-omni's own path as a
    baseline); ``bench(tokens, iters, device=...[, wheel=...])`` gives the file's one row."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=pack_tokens)
    ap.add_argument("--json", default=f"benchmarks/results/{name}.json")
    ap.add_argument("--smoke", action="store_true", help="a tiny pack on the CPU (TRITON_INTERPRET=1)")
    if wheel:
        ap.add_argument("--wheel", type=Path, help="vllm-omni 0.30.0 wheel or unpacked directory: its path too")
    args = ap.parse_args()
    extra = {"wheel": args.wheel} if wheel else {}
    if args.smoke:
        info = {**env_record("cpu"), "ceilings": None}
        row = bench(min(args.tokens, 40), min(args.iters, 2), device="cpu", **extra)
    else:
        ceilings = measure_ceilings()
        info = {**env_record(), "ceilings": ceilings.record()}
        row = bench(args.tokens, args.iters, **extra)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"benchmark": name, "env": info, "rows": [row]}, f, indent=2)
    if args.smoke:
        print("; ".join(row["acceptance"]))
        return
    copy = ceilings.copy_tb_s
    print(
        f"this device's copy {copy:.2f} TB/s, measured in this run; {row['tokens']} tokens; "
        + "; ".join(row["acceptance"])
    )
    for variant, r in row["results"].items():
        design = r.get("tb_s_design_bytes")
        on_design = "" if design is None else f"{design:.2f} TB/s on the design's bytes ({design / copy:.2f} of copy), "
        print(
            f"{variant:24s} p50 {r['p50_ms']:.3f} ms (p10 {r['p10_ms']:.3f}, p90 {r['p90_ms']:.3f})  {on_design}"
            f"{r['tb_s_minimum_bytes']:.2f} TB/s on the minimum bytes ({r['tb_s_minimum_bytes'] / copy:.2f} of copy)"
        )
