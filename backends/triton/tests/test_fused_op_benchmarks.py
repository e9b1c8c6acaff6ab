"""``benchmarks/{qk_norm_rope,output_gate,mhc}.py --smoke`` on the CPU (a tiny pack, the interpreter): each
whole script runs, judges the fused result by the contract and writes the record the GPU run writes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.parametrize(
    ("script", "tokens", "verdicts", "baselines"),
    [
        ("qk_norm_rope", 40, 2, {"native_eager", "native_compiled"}),
        ("output_gate", 40, 2, {"native_eager", "native_compiled", "native_compiled_dynamic"}),
        ("mhc", 12, 4, {"native_eager", "native_compiled"}),  # 12 tokens of 4 x 3072: the interpreter is slow
    ],
)
def test_fused_op_benchmark_smoke_writes_every_variant(
    tmp_path: Path, run_benchmark: Callable[..., Any], script: str, tokens: int, verdicts: int, baselines: set[str]
) -> None:
    out = tmp_path / f"{script}.json"
    report, _ = run_benchmark(script, "--smoke", "--tokens", str(tokens), "--json", str(out), out=out)
    assert report["benchmark"] == script and report["env"]["device"] == "cpu"
    (row,) = report["rows"]
    assert row["tokens"] == tokens and row.get("rotary_dim", 0) < row.get("head_dim", 1)
    passed = [v for v in row["acceptance"] if "PASS" in v and "FAIL" not in v]
    assert len(row["acceptance"]) == verdicts and passed == row["acceptance"], row["acceptance"]
    assert set(row["results"]) == {"fused_triton", *baselines}
    assert all(r["p50_ms"] > 0 for r in row["results"].values())
