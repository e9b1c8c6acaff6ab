"""``benchmarks/moe_raw.py --smoke`` on the CPU (tiny shape, the interpreter): the whole script runs and
writes the record the GPU run writes, so that the GPU run does not die on a typo."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any


def test_raw_weights_benchmark_smoke_writes_every_form(tmp_path: Path, run_benchmark: Callable[..., Any]) -> None:
    out = tmp_path / "moe_raw.json"
    report, _ = run_benchmark("moe_raw", "--smoke", "--out", str(out), out=out)
    assert report["device"] == "cpu" and report["smoke"] and report["errors"] == [] and report["git_commit"]
    (row,) = report["rows"]
    assert row["tokens"] == 9 and row["provider"] == "triton"
    assert set(row["ms"]) == {"prepared", "raw", "raw_repacked"}
    assert all(t["p50"] > 0 for t in row["ms"].values()) and row["raw_over_prepared"] > 0
    assert "PACKED_W13=0" in row["plans"]["raw"] and "PACKED_W13=0" not in row["plans"]["prepared"]
    assert row["raw_equals_prepared_bitwise"] and row["packs_per_raw_call"] == 0
    assert row["fresh_after_data_copy"]["ok"], row["fresh_after_data_copy"]["verdict"]
