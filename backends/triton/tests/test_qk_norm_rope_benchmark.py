"""``benchmarks/qk_norm_rope.py --smoke`` on the CPU (a tiny pack, the interpreter): the whole script runs,
judges q and k by the contract and writes the record the GPU run writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_qk_norm_rope_benchmark_smoke_writes_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "qk_norm_rope.json"
    env = dict(os.environ) | {"TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.qk_norm_rope", "--smoke", "--json", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "qk_norm_rope" and report["env"]["device"] == "cpu"
    (row,) = report["rows"]
    assert row["tokens"] == 40 and row["rotary_dim"] < row["head_dim"]
    assert len(row["acceptance"]) == 2 and all(": PASS" in v for v in row["acceptance"]), row["acceptance"]
    assert set(row["results"]) == {"fused_triton", "native_eager", "native_compiled"}
    assert all(r["p50_ms"] > 0 for r in row["results"].values())
