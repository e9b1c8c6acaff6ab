"""Smoke test of ``benchmarks/route_profile.py``'s plumbing on the CPU (tiny shapes, the interpreter).

The kernels are tested elsewhere; this runs the whole script (every variant, the experts, the
float64-truth check on random and planted inputs, the targets, the JSON) and feeds the JSON to the
report's summariser, so that the one-shot H200 run does not die on a typo. ~30 s on a loaded CPU.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_route_profile_runs_tiny_on_cpu(tmp_path: Path, run_benchmark: Callable[..., Any]) -> None:
    out = tmp_path / "route_fused.json"
    report, _ = run_benchmark("route_profile", "--dry-run", "--out", str(out), out=out)
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
