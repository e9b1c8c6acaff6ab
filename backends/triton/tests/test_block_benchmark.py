"""Smoke test of ``benchmarks/block.py``'s plumbing on the CPU (tiny shapes, the reference providers).

The kernels themselves are tested elsewhere; this runs the whole script end to end (weights prepared,
both stacks, every op alone, routing vs experts, deterministic vs default, targets, JSON, table) so
that the one-shot H200 run does not die on a typo. Slow-ish (~30 s on a loaded CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.slow
def test_block_benchmark_runs_tiny_on_cpu(tmp_path: Path, run_benchmark: Callable[..., Any]) -> None:
    out = tmp_path / "block.json"
    args = ("--device", "cpu", "--tiny", "--quick", "--iters", "1", "--out", str(out))
    report, stdout = run_benchmark("block", *args, out=out, interpret=False)  # the reference serves: fast
    assert report["env"]["device"] == "cpu" and report["env"]["git_commit"]
    assert report["config"]["layers"] >= 4 and report["strict"] is True
    (pack,) = report["packs"].values()
    assert pack["errors"] == {} and set(pack["block_ms"]) == {"eager", "baseline_eager"}
    # Both stacks against the FP32 oracle, layer by layer on the same input. (The two stacks' outputs
    # after several layers are not compared with a tolerance: routing is discontinuous, so rounding
    # differences flip near-tied routes and the stacks drift apart by design; docs/moe-notes.md.)
    orc = report["oracle"][next(iter(report["packs"]))]
    assert len(orc["layers"]) == report["config"]["layers"]
    for row in orc["layers"]:
        for path in ("magi2", "baseline"):
            err = row[path]
            assert 0 < err["layer_increment_clean_rows"] < 2e-2  # BF16 rounding, not a wrong layer
            assert 0 <= err["route_rows_other_experts"] < 0.1
            assert err["attention"] < 1e-2
        assert 0 < row["clean_token_fraction"] <= 1 and row["magi2_vs_baseline"]["route_rows_differ"] >= 0
    assert len(orc["stack_drift"]) == len(orc["layers"])
    assert any(k.startswith("40: layer 0 error vs the FP32 oracle <= the baseline's") for k in report["targets"])
    ops = pack["ops"]
    assert abs(sum(ops["magi2_share"].values()) - 1.0) < 1e-9
    assert set(ops["magi2"]) == set(ops["baseline"])
    assert [r["tokens"] for r in report["route_vs_experts"]] == [16, 40]
    assert all(r["ids_equal_reference"] for r in report["route_vs_experts"])
    assert report["deterministic"]["deterministic_runs_bitwise_equal"]
    assert all(r["route_contract_ok"] for r in report["route_vs_experts"])
    assert "route holds the routing contract at T=16" in report["targets"]
    assert isinstance(report["all_targets_met"], bool) and report["errors"] == {}
    assert "targets:" in stdout and "wrote" in stdout
