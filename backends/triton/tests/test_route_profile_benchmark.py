"""Smoke test of ``benchmarks/route_profile.py``'s plumbing on the CPU (tiny shapes, the interpreter).

The kernels are tested elsewhere; this runs the whole script (every variant, the experts, the
float64-truth check on random and planted inputs, the targets, the JSON) and feeds the JSON to the
report's summariser, so that the one-shot H200 run does not die on a typo. ~30 s on a loaded CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_route_profile_runs_tiny_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "route_fused.json"
    env = dict(os.environ) | {"TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.route_profile", "--dry-run", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["git_commit"]
    assert [(r["tokens"], r["heads"]) for r in report["rows"]] == [(9, 3), (20, 2)]
    for r in report["rows"]:
        names = set(r["ms"])
        assert {"fused", "triton", "torch", "vllm_omni_main", "vllm_omni_0.30", "gemm_fp32", "experts"} <= names and r[
            "best_config"
        ] in names
        for inputs in ("random", "planted"):
            fused = r["accuracy"][inputs]["fused"]
            assert fused["contract_ok"] and fused["clear_rows_wrong"] == 0
        assert r["accuracy"]["planted"]["fused"]["near_tie_rows"] > 0
    assert report["targets"] and all(report["targets"].values())  # the dry run's shapes have no speed target
    sys.path.insert(0, str(ROOT))
    from benchmarks import report as bench_report

    rows = bench_report.route_fused_rows(report)
    assert len(rows) == 2 and all("routing contract holds" in row[4] for row in rows)
