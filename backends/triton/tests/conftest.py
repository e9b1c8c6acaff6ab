"""Fixtures shared by the Triton backend's tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def pack_count(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """How many gate/up banks the backend builds while the test runs: ``pack_w13`` wrapped where the
    backend calls it (a test's own ``pack_w13`` calls are not counted)."""
    from magi2_backend_triton import providers
    from magi2_backend_triton.moe import fused, pack

    built = [0]
    real = pack.pack_w13

    def counting(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
        built[0] += 1
        return real(w_gate, w_up)

    for module in (fused, providers):
        monkeypatch.setattr(module, "pack_w13", counting)
    return lambda: built[0]


@pytest.fixture
def run_benchmark() -> Callable[..., Any]:
    """``run(module, *args, out=PATH, interpret=True)``: ``python -m benchmarks.<module> <args>`` from the
    checkout (under ``TRITON_INTERPRET=1`` unless ``interpret=False``), then ``(the JSON it wrote to out,
    its stdout)``; a failed run fails the test with the end of its stderr."""

    def run(module: str, *args: str, out: Path, interpret: bool = True) -> tuple[Any, str]:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        if interpret:
            env["TRITON_INTERPRET"] = "1"
        proc = subprocess.run(
            [sys.executable, "-m", f"benchmarks.{module}", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(out.read_text()), proc.stdout

    return run
