"""The dispatch-overhead measurement (``magi2 overhead``, benchmarks/dispatch.py): its rows, its devices, its JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import magi2_core as m2
from benchmarks import dispatch as dispatch_script
from magi2_core.errors import InvalidDeviceError
from magi2_core.model.problem import OPS
from magi2_core.tools.overhead import NOOP_PROVIDER, dispatch_overhead


def _check_rows(rows: list[dict[str, Any]]) -> None:
    assert [r["op"] for r in rows] == list(OPS)
    for r in rows:
        assert r["public_us"] > 0 and r["direct_us"] > 0 and r["resolve_us"] > 0, r
        assert r["added_us"] == pytest.approx(r["public_us"] - r["direct_us"]), r
        assert r["added_inference_us"] > 0, r  # the public call under inference_mode still validates
    assert not [p for op in OPS for p in m2.get_registry().state().providers[op] if p.name == NOOP_PROVIDER]


def test_cpu_rows_time_every_op_and_leave_no_provider_behind() -> None:
    _check_rows(dispatch_overhead(iters=20))


def test_cuda_inputs_without_cuda_are_refused_clearly() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(InvalidDeviceError, match="sees no CUDA device"):
        dispatch_overhead(iters=20, device="cuda")


def test_an_unknown_device_is_refused() -> None:
    with pytest.raises(InvalidDeviceError, match="'cpu' or 'cuda'"):
        dispatch_overhead(iters=20, device="gpu")


@pytest.mark.gpu
def test_cuda_rows_time_every_op_on_gpu_inputs() -> None:
    _check_rows(dispatch_overhead(iters=20, device="cuda"))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_script_records_the_inputs_device_and_the_per_call_id_scan(
    device: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []

    def fake(iters: int, device: str) -> list[dict[str, Any]]:
        seen.append(device)
        return [
            {
                "op": "attention",
                "resolve_us": 1.0,
                "public_us": 3.0,
                "direct_us": 1.0,
                "added_us": 2.0,
                "added_inference_us": 1.5,
            }
        ]

    monkeypatch.setattr(dispatch_script, "dispatch_overhead", fake)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    out = tmp_path / "d.json"
    monkeypatch.setattr(sys, "argv", ["dispatch", "--device", device, "--out", str(out)])
    dispatch_script.main()
    data = json.loads(out.read_text())
    assert seen == [device]
    assert data["inputs_device"] == ("cuda: Fake GPU" if device == "cuda" else "cpu")
    assert "moe_experts with host expert ids scans the ids' values on every call" in data["method"]
    assert dispatch_script.default_out(device).name == f"dispatch_{device}.json"
