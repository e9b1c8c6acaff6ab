"""benchmarks/vllm_omni_stack.py on the CPU (``--smoke``): builds the stack from vllm-omni's own
modules, runs every variant, and writes the record the GPU run writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import vllm_omni_stack as stack


def test_stack_benchmark_smoke_writes_every_variant(vllm_omni_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "stack.json"
    # compile_regions compiles in place: the modes run eager first, whatever the order given
    argv = ["--wheel", str(vllm_omni_root), "--smoke", "--layers", "2", "--tokens", "24", "--iters", "1"]
    argv += ["--modes", "compiled", "eager"]
    assert stack.main([*argv, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["errors"] == []
    assert report["vllm_omni"] == "0.30.0" and report["device"] == "cpu" and report["git_commit"]
    assert report["config"]["moe_layers"] == 2 and report["compile_regions"]["fullgraph"] is True
    assert report["providers"]["24"] == {
        **dict.fromkeys(("attention", "moe_route", "moe_experts", "rmsnorm"), "reference"),
        # auto: on a CPU the mHC, the q/k RoPE and the output gate resolve to the reference: not swapped
        **dict.fromkeys(("mhc_pre", "mhc_mix", "qk_norm_rope", "output_gate"), None),
    }
    assert [(r["mode"], r["tokens"]) for r in report["results"]] == [("eager", 24), ("compiled", 24)]
    for r in report["results"]:
        assert r["finite"] and 0 < r["rel_l2_on_vs_off"] < 0.1  # BF16: the swapped ops round differently
        assert r["speedup"] == r["ms_per_layer"]["off"]["p50"] / r["ms_per_layer"]["on"]["p50"] > 0
    assert report["breakdown"] == []  # profiled on a GPU only


def test_layer_breakdown_divides_one_block_call_by_its_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from benchmarks._breakdown import KernelTime

    kernels = [
        KernelTime("_rmsnorm_kernel", 300.0, "aten::empty", ((8, 64),)),
        KernelTime("Memcpy DtoD (Device -> Device)", 500.0, "aten::copy_", ((8, 64), (8, 64))),
    ]
    monkeypatch.setattr(stack, "profile_call", lambda fn: kernels)
    moe = SimpleNamespace(shared_expert_intermediate_size=16, modality_shared_expert_intermediate_size=16)
    cfg = SimpleNamespace(hidden_size=64, mhc=SimpleNamespace(num_streams=2), num_heads_q=4, moe=moe)
    rows = stack.layer_breakdown(lambda pack: None, None, cfg, layers=2)
    assert rows["per_layer_of"] == 2 and rows["kernel_ms"] == 0.4 and rows["launches"] == 2
    copies = rows["categories"]["torch elementwise and copies"]
    assert copies["ms"] == 0.25 and copies["share"] == 0.625 and copies["launches"] == 1
    assert copies["top_kernels"] == {"Memcpy DtoD (Device -> Device)": 0.25}
    assert copies["top_sources"] == {"Memcpy DtoD (Device -> Device) <- aten::copy_ [8, 64] [8, 64]": 0.25}


def test_modes_run_in_the_benchmarks_order_once_and_unknown_ones_are_refused() -> None:
    from benchmarks._common import in_run_order

    assert in_run_order(["graph", "compiled", "eager", "compiled"], ("eager", "compiled", "graph")) == [
        "eager",
        "compiled",
        "graph",
    ]
    assert in_run_order(["compiled"], stack.MODES) == ["compiled"]
    with pytest.raises(ValueError, match=r"unknown modes \['graph'\]"):
        in_run_order(["graph", "eager"], stack.MODES)
