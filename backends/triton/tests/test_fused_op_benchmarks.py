"""``benchmarks/qk_norm_rope.py --smoke`` and ``benchmarks/output_gate.py --smoke`` on the CPU (a tiny pack,
the interpreter): each whole script runs, judges the fused result by the contract and writes the record
the GPU run writes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.parametrize(
    ("script", "verdicts", "baselines"),
    [
        ("qk_norm_rope", 2, {"native_eager", "native_compiled"}),
        ("output_gate", 2, {"native_eager", "native_compiled", "native_compiled_dynamic"}),
    ],
)
def test_fused_op_benchmark_smoke_writes_every_variant(
    tmp_path: Path, run_benchmark: Callable[..., Any], script: str, verdicts: int, baselines: set[str]
) -> None:
    out = tmp_path / f"{script}.json"
    report, _ = run_benchmark(script, "--smoke", "--json", str(out), out=out)
    assert report["benchmark"] == script and report["env"]["device"] == "cpu"
    (row,) = report["rows"]
    assert row["tokens"] == 40 and row.get("rotary_dim", 0) < row["head_dim"]
    assert len(row["acceptance"]) == verdicts and all(": PASS" in v for v in row["acceptance"]), row["acceptance"]
    assert set(row["results"]) == {"fused_triton", *baselines}
    assert all(r["p50_ms"] > 0 for r in row["results"].values())
