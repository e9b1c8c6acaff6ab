"""``benchmarks/moe_raw.py --smoke`` on the CPU (tiny shape, the interpreter): the whole script runs and
writes the record the GPU run writes, so that the GPU run does not die on a typo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_raw_weights_benchmark_smoke_writes_every_form(tmp_path: Path) -> None:
    out = tmp_path / "moe_raw.json"
    env = dict(os.environ) | {"TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.moe_raw", "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["smoke"] and report["errors"] == [] and report["git_commit"]
    (row,) = report["rows"]
    assert row["tokens"] == 9 and row["provider"] == "triton"
    assert set(row["ms"]) == {"prepared", "raw", "raw_repacked"}
    assert all(t["p50"] > 0 for t in row["ms"].values()) and row["raw_over_prepared"] > 0
    assert "PACKED_W13=0" in row["plans"]["raw"] and "PACKED_W13=0" not in row["plans"]["prepared"]
    assert row["raw_equals_prepared_bitwise"] and row["packs_per_raw_call"] == 0
    assert row["fresh_after_data_copy"]["ok"], row["fresh_after_data_copy"]["verdict"]
