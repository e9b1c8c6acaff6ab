"""benchmarks/dit_step.py on the CPU: the 272p / 10 s pack as vllm-omni's data proxy builds it, the
smoke run of every mode and form, and the profiler breakdown's sorting of kernels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks import dit_step
from benchmarks._breakdown import GemmWidths, KernelTime, breakdown, category

WIDTHS = GemmWidths(hidden=3072, streams=4, heads_q=24, shared_intermediate=(1280,))


def test_step_pack_is_the_pipelines_272p_10s_cfg_pack(vllm_omni: object) -> None:
    shape = dit_step.step_shape(False, text_tokens=370)
    assert shape.video == (1, 48, 32, 16, 28) and shape.audio == (1, 250, 64)
    summary = dit_step.pack_summary(dit_step.step_input(shape, "cpu"))
    per = {"video": 32 * 16 * 28, "audio": 250, "text": 370, "total": 32 * 16 * 28 + 250 + 370}
    assert summary["per_sequence"] == [per, per]  # conditional and unconditional branch
    assert summary["tokens"] == 2 * per["total"] and summary["max_seqlen"] == per["total"]


def test_dit_step_smoke_writes_every_mode_and_form(vllm_omni_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "dit.json"
    assert dit_step.main(["--wheel", str(vllm_omni_root), "--smoke", "--iters", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["errors"] == [] and report["device"] == "cpu" and report["vllm_omni"] == "0.30.0"
    work = {w["category"]: w for w in report["work"]}
    assert work["attention"]["kind"] == "bf16" and work["attention"]["tflop"] > 0
    assert "matmul_floor_s" not in report and "ceilings" not in report  # a CPU run has no device ceilings
    assert report["config"]["layers"] == 6 and report["config"]["moe_layers"] == [2, 3]
    assert report["pack"]["sequences"] == 2
    timed = {(r["form"], r["mode"], r["plugin"]) for r in report["results"] if "s_per_step" in r}
    for plugin in ("off", "on"):
        assert {
            ("forward", "eager", plugin),
            ("forward", "compiled", plugin),
            ("block", "graph", plugin),
            ("distinct-banks", "eager", plugin),
        } <= timed
    checks = [r for r in report["results"] if r["form"] == "check"]
    assert [c["mode"] for c in checks] == ["eager", "compiled"]
    assert all(c["finite"] and 0 < c["rel_l2_on_vs_off"] < 0.2 for c in checks)  # BF16: the ops round differently
    assert report["dynamo_counters"]["stats"]["unique_graphs"] > 0
    layers = report["fidelity"]["layers"]
    assert [r["layer"] for r in layers] == list(range(6)) and [r["moe"] for r in layers] == [0, 0, 1, 1, 0, 0]
    assert all(0 < r["off_rel_err"] < 0.2 and 0 < r["on_rel_err"] < 0.2 for r in layers)  # BF16 vs FP32
    assert all(0 <= r["on_route_flips"] <= 1 for r in layers if r["moe"])
    assert all(0 < r["clean_token_share"] <= 1 for r in layers)
    assert all(r["clean_token_share"] == 1 and r["on_rel_err_clean"] == r["on_rel_err"] for r in layers if not r["moe"])
    assert all(0 < r["off_rel_err_clean"] < 0.2 and 0 < r["on_rel_err_clean"] < 0.2 for r in layers)
    assert set(report["fidelity"]["on_worse_than_off_on_clean_tokens_at"]) <= set(range(6))


@pytest.mark.parametrize(
    ("kernel", "want"),
    [
        (KernelTime("void flash::FlashAttnFwdSm90<...>"), "attention"),
        (KernelTime("_sink_correction_kernel"), "attention"),
        (KernelTime("fused_expert_tma_kernel"), "routed experts"),
        (KernelTime("_mh_moe_kernel"), "routed experts"),
        (KernelTime("topk_sum_kernel"), "routed experts"),  # the experts' combine over the top k
        (KernelTime("_route_kernel"), "route"),
        (KernelTime("void at::native::sbtopk::gatherTopK<...>"), "route"),  # upstream's torch.topk
        (KernelTime("_rmsnorm_kernel"), "rmsnorm"),
        (KernelTime("_mhc_mix_kernel"), "mHC kernels"),
        (KernelTime("_qk_norm_rope_kernel"), "q/k norm + RoPE"),
        (KernelTime("_output_gate_kernel"), "output gate"),
        (KernelTime("triton_red_fused_mean_mul_pow_rsqrt_0"), "inductor fused"),
        (KernelTime("nvjet_sss_64x8", 1.0, "aten::mm", ((8, 12288), (12288, 24))), "mHC projection"),
        (KernelTime("gemv2T_kernel", 1.0, "aten::mm", ((8, 3072), (3072, 24))), "attention gate projection"),
        (KernelTime("sm90_xmma_gemm", 1.0, "aten::linear", ((8, 3072), (24, 3072))), "attention gate projection"),
        (KernelTime("sm90_xmma_gemm", 1.0, "aten::mm", ((8, 3072), (3072, 2560))), "shared experts"),
        (KernelTime("sm90_xmma_gemm", 1.0, "aten::mm", ((8, 1280), (1280, 3072))), "shared experts"),
        (KernelTime("sm90_xmma_gemm", 1.0, "aten::mm", ((8, 3072), (3072, 9216))), "dense GEMMs"),
        (KernelTime("gemv2N_kernel", 1.0, "aten::bmm", ((8, 1, 4), (8, 4, 3072))), "mHC stream sums"),
        (KernelTime("nvjet_sm90_tst_512x8", 1.0, "aten::bmm", ((8, 4, 4), (8, 4, 3072))), "mHC stream sums"),
        (KernelTime("CatArrayBatchedCopy<...>"), "torch.cat"),
        (KernelTime("indexSelectLargeIndex<...>"), "gathers"),
        (KernelTime("vectorized_elementwise_kernel<...>"), "torch elementwise and copies"),
    ],
)
def test_breakdown_sorts_kernels_into_the_layers_operators(kernel: KernelTime, want: str) -> None:
    assert category(kernel, WIDTHS) == want


def test_breakdown_sums_and_shares() -> None:
    rows = breakdown(
        [
            KernelTime("_rmsnorm_kernel", 300.0, "aten::empty", ((8, 64),)),
            KernelTime("_rmsnorm_kernel", 100.0),
            KernelTime("fused_expert_kernel", 600.0),
        ],
        WIDTHS,
    )
    assert rows["kernel_ms"] == 1.0 and rows["launches"] == 3
    assert list(rows["categories"]) == ["routed experts", "rmsnorm"]
    assert rows["categories"]["rmsnorm"] == {
        "ms": 0.4,
        "share": 0.4,
        "launches": 2,
        "top_kernels": {"_rmsnorm_kernel": 0.4},
        "top_sources": {"_rmsnorm_kernel <- aten::empty [8, 64]": 0.3, "_rmsnorm_kernel <- no aten op": 0.1},
    }


def test_kernels_from_trace_links_each_kernel_to_its_launching_op_once() -> None:
    from benchmarks._breakdown import kernels_from_trace

    op = {
        "cat": "cpu_op",
        "name": "aten::mm",
        "pid": 1,
        "tid": 2,
        "ts": 10.0,
        "dur": 5.0,
        "args": {"Input Dims": [[8, 12288], [12288, 24]]},
    }
    outer = {"cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 2, "ts": 9.0, "dur": 8.0, "args": {}}
    launch = {
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": 2,
        "ts": 12.0,
        "dur": 1.0,
        "args": {"correlation": 7},
    }
    triton = {
        "cat": "cuda_driver",
        "name": "cuLaunchKernelEx",
        "pid": 1,
        "tid": 2,
        "ts": 30.0,
        "dur": 1.0,
        "args": {"correlation": 8},
    }
    gemm = {"cat": "kernel", "name": "sm80_xmma_gemm_f32f32", "ts": 13.0, "dur": 40.0, "args": {"correlation": 7}}
    norm = {"cat": "kernel", "name": "_rmsnorm_kernel", "ts": 60.0, "dur": 20.0, "args": {"correlation": 8}}
    kernels = kernels_from_trace({"traceEvents": [outer, op, launch, triton, gemm, norm]})
    assert [(k.name, k.us, k.op, k.shapes) for k in kernels] == [
        ("sm80_xmma_gemm_f32f32", 40.0, "aten::mm", ((8, 12288), (12288, 24))),
        ("_rmsnorm_kernel", 20.0, "", ()),
    ]
    assert [category(k, WIDTHS) for k in kernels] == ["mHC projection", "rmsnorm"]


def test_with_the_method_swaps_on_plugin_off_keeps_upstreams_methods(vllm_omni: Path) -> None:
    """The mHC, q/k RoPE and output-gate swaps replace methods on vllm-omni's classes, which the plugin-off
    model shares: the benchmark binds upstream's methods back on plugin off's modules, so off is vllm-omni's own."""
    import os

    from benchmarks.vllm_omni_stack import providers
    from magi2_core.integrations.vllm_omni.gate import AttentionOutputMethods
    from magi2_core.integrations.vllm_omni.mhc import METHODS, MHCLayerMethods
    from magi2_core.integrations.vllm_omni.qk_rope import AttentionProjectMethods

    names = ("MAGI2_VLLM_OMNI_MHC", "MAGI2_VLLM_OMNI_QK_ROPE", "MAGI2_VLLM_OMNI_OUTPUT_GATE")
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(dict.fromkeys(names, "1"))
    try:
        cfg = dit_step.model_config(True)
        off, on = dit_step.build_pair(cfg, "cpu", banks=1)
        for name in METHODS:
            assert all(getattr(layer, name).__func__ is getattr(MHCLayerMethods, name) for layer in on.block.layers)
            assert all(
                getattr(layer, name).__func__ is not getattr(MHCLayerMethods, name) for layer in off.block.layers
            )
        packed = dit_step.step_input(dit_step.step_shape(True, text_tokens=8), "cpu")
        binput = dit_step.block_input(off, packed, "cpu")
        project = AttentionProjectMethods.project
        assert all(layer.attention.project.__func__ is project for layer in on.block.layers)
        assert all(getattr(layer.attention.project, "__func__", None) is not project for layer in off.block.layers)
        output = AttentionOutputMethods.output
        assert all(layer.attention.output.__func__ is output for layer in on.block.layers)
        assert all(getattr(layer.attention.output, "__func__", None) is not output for layer in off.block.layers)
        chosen = providers(on, cfg, binput)
        assert None not in (chosen["mhc_pre"], chosen["mhc_mix"], chosen["qk_norm_rope"], chosen["output_gate"])
        with torch.inference_mode():
            args = (binput.hidden, binput.rope, binput.varlen, binput.dispatcher, [binput.hidden.shape[0]])
            want, got = off.block(*args), on.block(*args)
        assert torch.isfinite(got).all() and 0 < float((got - want).norm() / want.norm()) < 0.2
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- the step's arithmetic (benchmarks/_step_flops.py) against torch's FLOP counter ------------------

# Module names (as torch's FLOP counter keys them) whose products belong to one category.
_SCOPES = {
    "attention": r"\.attention\.packed_attention$",
    "routed experts + route": r"\.mlp\.moe_mlp$",
    "attention gate projection": r"\.attention\.linear_g$",
    "shared experts": r"\.mlp\.(modality_specific_)?shared_expert_fc[12]$",
    "dense GEMMs": r"\.(attention\.linear_(qkv|proj)|mlp\.(split_linear|merge_linear|up_gate_proj|down_proj))$",
    "adapters": r"^Magi2PreviewTransformer\.(pre|post)_adapter$",
}


def _distinct_config() -> object:
    """A second tiny model whose widths all differ (GQA, 4 streams, 3 MoE heads), so that a count
    which mixes two of them up cannot agree with the counter by coincidence."""
    cfg = dit_step._mod("configuration_magi2")
    return cfg.Magi2PreviewConfig(
        num_layers=5,
        hidden_size=96,
        head_dim=16,
        num_query_groups=2,
        video_in_channels=4,
        audio_in_channels=4,
        text_in_channels=8,
        intermediate_factor=2.0,
        multimodal_layers=(0, 4),
        mhc=cfg.Magi2MHCConfig(num_streams=4),
        moe=cfg.Magi2MoEConfig(
            num_heads=3,
            num_experts=8,
            top_k=3,
            expert_intermediate_size=24,
            shared_expert_intermediate_size=40,
            modality_shared_expert_intermediate_size=8,
            layers=(1, 2, 3),
        ),
    )


@pytest.mark.parametrize("which", ["smoke", "distinct"])
def test_step_work_counts_what_the_model_multiplies(vllm_omni: object, which: str) -> None:
    import re

    from torch.utils.flop_counter import FlopCounterMode

    from benchmarks._step_flops import matmul_floor_s, step_work

    cfg = dit_step.model_config(True) if which == "smoke" else _distinct_config()
    packed = dit_step.step_input(dit_step.step_shape(True, text_tokens=6), "cpu")
    torch.manual_seed(0)
    model = dit_step._mod("modeling_magi2").Magi2PreviewTransformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
    model.eval().requires_grad_(False)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(*packed.model_args)
    counts = counter.get_flop_counts()

    def scoped(pattern: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, ops in counts.items():
            if re.search(pattern, name):
                for op, n in ops.items():
                    out[str(op)] = out.get(str(op), 0) + n
        return out

    work = {w.category: w for w in step_work(cfg, dit_step.pack_summary(packed)["per_sequence"])}
    assert sum(w.flops for w in work.values()) == counter.get_total_flops()
    seen = {name: sum(scoped(pattern).values()) for name, pattern in _SCOPES.items()}
    assert seen["routed experts + route"] == work["routed experts"].flops + work["route"].flops
    for name in ("attention", "attention gate projection", "shared experts", "dense GEMMs", "adapters"):
        assert seen[name] == work[name].flops, name
    # What no module above holds runs at a layer's own scope: the mHC projections (mm), the stream
    # products (bmm, in the layer and its MHCMix).
    held = scoped("|".join(f"(?:{p})" for p in _SCOPES.values()))
    every = {str(op): n for op, n in counts["Global"].items()}
    assert every["aten.mm"] - held.get("aten.mm", 0) == work["mHC projection"].flops
    assert every["aten.bmm"] - held.get("aten.bmm", 0) == work["mHC stream sums"].flops
    bf16 = sum(w.flops for w in work.values() if w.kind == "bf16")
    assert matmul_floor_s(list(work.values()), 1.0) == pytest.approx(bf16 / 1e12)
