"""The vllm-omni integration against vllm-omni 0.30.0's own modules (the released wheel, unmodified).

The ``vllm_omni`` fixture (``conftest.py``) imports the wheel with vLLM stubbed; every stub is listed
in ``benchmarks/_vllm_stubs.py``. Numerics are compared with vllm-omni's own torch paths (what it runs
on the CPU) at vllm-omni's own test tolerances: RMSNorm ``1e-6`` (FP32) or one BF16 rounding, MoE
``2e-5`` (FP32) or ``2e-2`` (BF16, unit-scale activations), attention ``1e-5`` (FP32) or ``2e-2``.
Layer-wise offloading is in ``test_vllm_omni_offload.py``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import magi2_core as m2
from benchmarks import _vllm_stubs as stubs
from magi2_core import config as m2_config
from magi2_core.errors import ConfigError
from magi2_core.integrations import vllm_omni as integ
from magi2_core.integrations.vllm_omni import plugin
from magi2_core.integrations.vllm_omni.gate import AttentionOutputMethods
from magi2_core.integrations.vllm_omni.mhc import METHODS, MHCLayerMethods
from magi2_core.integrations.vllm_omni.qk_rope import AttentionProjectMethods
from magi2_core.integrations.vllm_omni.shared_experts import SharedExpertsMethods

PKG = "vllm_omni.diffusion.models.magi2"
DIST = Path(__file__).parents[1] / "distributed"


def _mod(name: str) -> ModuleType:
    return importlib.import_module(f"{PKG}.{name}")


@pytest.fixture(autouse=True)
def _mhc_swap_on() -> Iterator[None]:
    """On a CPU the mHC, q/k RoPE and output-gate swaps are left out unless asked for (``auto``: the
    reference serves them here); these tests ask for all three and check them with the others, except where
    a test sets a variable. (Not through ``monkeypatch``: that would move the test's own monkeypatch
    teardown after the ``vllm_omni`` fixture's.)"""
    names = ("MAGI2_VLLM_OMNI_MHC", "MAGI2_VLLM_OMNI_QK_ROPE", "MAGI2_VLLM_OMNI_OUTPUT_GATE")
    before = {name: os.environ.get(name) for name in names}
    os.environ.update(dict.fromkeys(names, "1"))
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def test_the_mhc_swap_is_automatic_only_where_a_fused_provider_serves(
    vllm_omni: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Unset (``auto``): on this CPU the typical call resolves to the reference, which computes
    vllm-omni's own form, so the mHC is left as it is; the other swaps happen."""
    monkeypatch.delenv("MAGI2_VLLM_OMNI_MHC")
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    modeling = _mod("modeling_magi2")
    assert _swapped(modeling) == {
        "attention": True,
        "moe": True,
        "rmsnorm": True,
        "mhc": False,
        "qk_norm_rope": True,
        "output_gate": True,
        "shared_experts": True,
    }
    said = [r.getMessage() for r in caplog.records if "mhc left as it is" in r.getMessage()]
    assert len(said) == 1 and "(MAGI2_VLLM_OMNI_MHC=auto)" in said[0] and "'reference'" in said[0], said


def test_the_mhc_swap_is_automatic_where_the_fused_provider_serves(
    vllm_omni: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auto`` swaps the mHC in where a typical call resolves to a fused provider (Triton, on CUDA)."""
    from magi2_core.integrations.vllm_omni import plugin

    real = plugin._describe_provider

    def served(op: str, mod: ModuleType) -> tuple[str, tuple[str | None, ...]]:
        return ("triton here", ("triton", "triton")) if op == "mhc" else real(op, mod)

    monkeypatch.setattr(plugin, "_describe_provider", served)
    monkeypatch.setenv("MAGI2_VLLM_OMNI_MHC", "auto")
    integ.register()
    assert _swapped(_mod("modeling_magi2"))["mhc"] is True


@pytest.mark.parametrize("value", ["0", "off"])
def test_the_mhc_swap_is_left_off_when_asked(
    vllm_omni: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, value: str
) -> None:
    from magi2_core.integrations.vllm_omni import plugin

    monkeypatch.setattr(plugin, "_describe_provider", lambda op, mod: ("triton here", ("triton",)))
    monkeypatch.setenv("MAGI2_VLLM_OMNI_MHC", value)
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    assert _swapped(_mod("modeling_magi2")) == {
        "attention": True,
        "moe": True,
        "rmsnorm": True,
        "mhc": False,
        "qk_norm_rope": True,
        "output_gate": True,
        "shared_experts": True,
    }
    assert any("mhc left as it is (MAGI2_VLLM_OMNI_MHC=0)" in r.getMessage() for r in caplog.records)


def _swapped(modeling: ModuleType) -> dict[str, bool]:
    return {
        "attention": _mod("attention").packed_attention_with_sink is integ.packed_attention_with_sink,
        "moe": modeling.Magi2MultiHeadMoE is integ.Magi2MultiHeadMoE,
        "rmsnorm": modeling.MultiModalityRMSNorm is integ.MultiModalityRMSNorm,
        "mhc": all(getattr(modeling.Magi2TransformerLayer, m) is getattr(MHCLayerMethods, m) for m in METHODS),
        "qk_norm_rope": modeling.Magi2Attention.project is AttentionProjectMethods.project,
        "output_gate": modeling.Magi2Attention.output is AttentionOutputMethods.output,
        "shared_experts": modeling.Magi2MultiHeadMoELayer._shared_experts is SharedExpertsMethods._shared_experts,
    }


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("magi2_core")]


def _fake_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    """Make ``importlib.metadata`` report vllm-omni ``version`` (found before the wheel's own)."""
    info = tmp_path / f"vllm_omni-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-omni\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()


def _small_config(
    dtype: torch.dtype = torch.float32, *, sinks: int = 1, softcap: float = -1.0, kv_groups: int = 4
) -> Any:
    """vllm-omni's own config class at small widths (so the checkpoint names are the release's)."""
    cfg = _mod("configuration_magi2")
    return cfg.Magi2PreviewConfig(
        num_layers=3,
        hidden_size=64,
        head_dim=16,
        num_query_groups=kv_groups,
        video_in_channels=4,
        audio_in_channels=6,
        text_in_channels=8,
        intermediate_factor=1.0,
        multimodal_layers=(0, 2),
        params_dtype=dtype,
        attention_softcap=softcap,
        attention_sink_tokens=sinks,
        mhc=cfg.Magi2MHCConfig(num_streams=2),
        moe=cfg.Magi2MoEConfig(
            num_heads=4,
            num_experts=8,
            top_k=2,
            expert_intermediate_size=32,
            shared_expert_intermediate_size=16,
            modality_shared_expert_intermediate_size=16,
            layers=(1, 2),
        ),
    )


def _random_checkpoint(model: torch.nn.Module, seed: int = 5, scale: float | None = None) -> dict[str, torch.Tensor]:
    """Fresh random values for every checkpoint tensor (the RoPE bands keep their defined values):
    ``randn * scale``, or where no scale is given 0.3 for the MoE's tensors and 0.1 for the rest."""
    g = torch.Generator().manual_seed(seed)
    ckpt = {}
    for name, t in model.state_dict().items():
        s = scale if scale is not None else 0.3 if ".moe_mlp." in name else 0.1
        value = t.clone() if name.endswith(".bands") else torch.randn(t.shape, generator=g, dtype=torch.float64) * s
        ckpt[name] = value.to(t.dtype).contiguous()
    return ckpt


def _layout(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {n: (tuple(t.shape), t.dtype) for n, t in model.state_dict().items()}


# ---------------------------------------------------------------------------------------------
# the plugin on the real modules
# ---------------------------------------------------------------------------------------------
def test_absent_vllm_omni_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="magi2_core")
    assert importlib.util.find_spec("vllm_omni") is None  # CI installs no vllm-omni; the fixture is not used
    integ.register()
    assert _records(caplog) == []
    assert not any(isinstance(f, plugin._PatchOnImport) for f in sys.meta_path)


@pytest.mark.parametrize("import_first", [False, True], ids=["hook", "already-imported"])
def test_plugin_swaps_the_operators_and_the_shared_experts(
    vllm_omni: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, import_first: bool
) -> None:
    caplog.set_level(logging.INFO, logger="magi2_core")
    if import_first:
        modeling = _mod("modeling_magi2")
        assert not any(_swapped(modeling).values())
        integ.register()
    else:
        integ.register()
        assert f"{PKG}.modeling_magi2" not in sys.modules  # nothing imported at plugin load
        modeling = _mod("modeling_magi2")
    assert _swapped(modeling) == {
        "attention": True,
        "moe": True,
        "rmsnorm": True,
        "mhc": True,
        "qk_norm_rope": True,
        "output_gate": True,
        "shared_experts": True,
    }
    info = [r.getMessage() for r in _records(caplog) if r.levelno == logging.INFO]
    assert len(info) == 7, info
    for op, text in zip(("attention", "moe", "rmsnorm", "mhc", "qk_norm_rope", "output_gate"), info[:6], strict=True):
        assert f"MAGI-2 {op} " in text and "resolves" in text and "'reference'" in text, text
    assert "MAGI-2 shared_experts " in info[6] and "bit for bit" in info[6], info[6]
    model = modeling.Magi2PreviewTransformer(_small_config())
    kinds = {type(m) for m in model.modules()}
    assert integ.Magi2MultiHeadMoE in kinds and integ.MultiModalityRMSNorm in kinds
    assert _mod("mh_moe").Magi2MultiHeadMoE not in kinds and _mod("layers").MultiModalityRMSNorm not in kinds
    # attention: vllm-omni's Ulysses wrapper looks the function up on every call, in every layer
    calls: list[int] = []
    original = integ.attention.varlen_attention_with_sink
    monkeypatch.setattr(
        integ.attention, "varlen_attention_with_sink", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    model.load_state_dict(_random_checkpoint(model))
    assert torch.isfinite(_run_model(model, model.config)).all()
    assert len(calls) == model.config.num_layers


def test_register_is_idempotent_and_unregister_restores(vllm_omni: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    integ.register()
    assert sum(isinstance(f, plugin._PatchOnImport) for f in sys.meta_path) == 1
    modeling = _mod("modeling_magi2")
    integ.register()
    assert all(_swapped(modeling).values())
    assert len([r for r in _records(caplog) if r.levelno == logging.INFO]) == 7
    integ.unregister()
    assert not any(_swapped(modeling).values())
    assert modeling.Magi2MultiHeadMoE is _mod("mh_moe").Magi2MultiHeadMoE
    assert integ.Magi2MultiHeadMoE.stands_in_for == ()


@pytest.mark.parametrize("version", ["0.31.0", "0.29.2", "1.0.0"])
def test_other_vllm_omni_version_logs_and_does_nothing(
    vllm_omni: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, version: str
) -> None:
    _fake_distribution(tmp_path, monkeypatch, version)
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    assert not any(_swapped(_mod("modeling_magi2")).values())
    (record,) = _records(caplog)
    assert record.levelno == logging.WARNING
    assert f"vllm-omni {version} is installed" in record.getMessage() and "0.31" in record.getMessage()


def test_patch_release_of_the_supported_minor_is_accepted(
    vllm_omni: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_distribution(tmp_path, monkeypatch, "0.30.2")
    integ.register()
    assert all(_swapped(_mod("modeling_magi2")).values())


def test_magi2_vllm_omni_changed_after_the_swap_is_refused(vllm_omni: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    integ.register()
    assert all(_swapped(_mod("modeling_magi2")).values())
    x, w = torch.randn(2, 8), torch.randn(1, 1, 8)
    monkeypatch.setenv("MAGI2_VLLM_OMNI", "0")
    with pytest.raises(m2.ConfigChangeError, match="MAGI2_VLLM_OMNI") as info:
        m2.rmsnorm(x, w)
    assert "plugin load" in str(info.value)
    with pytest.raises(m2.ConfigChangeError, match="MAGI2_VLLM_OMNI"):
        m2.reload_config()  # cannot be redone in place either
    monkeypatch.setenv("MAGI2_VLLM_OMNI", "yes")  # the value in use, spelled otherwise: accepted
    assert m2.rmsnorm(x, w).shape == (2, 8)
    integ.unregister()  # lets go of it
    monkeypatch.setenv("MAGI2_VLLM_OMNI", "0")
    assert m2_config.get("MAGI2_VLLM_OMNI") is False


def test_opt_out_logs_and_does_nothing(
    vllm_omni: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MAGI2_VLLM_OMNI", "0")
    m2.reload_config()
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    assert not any(_swapped(_mod("modeling_magi2")).values())
    (record,) = _records(caplog)
    assert record.levelno == logging.INFO and "MAGI2_VLLM_OMNI=0" in record.getMessage()


def test_no_distribution_metadata_logs_and_does_nothing(
    vllm_omni_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "vllm_omni").symlink_to(vllm_omni_root / "vllm_omni")  # the package without its dist-info
    caplog.set_level(logging.INFO, logger="magi2_core")
    with stubs.installed(tmp_path):
        try:
            integ.register()
            assert not any(_swapped(_mod("modeling_magi2")).values())
        finally:
            integ.unregister()
    (record,) = _records(caplog)
    assert record.levelno == logging.WARNING and "cannot be checked" in record.getMessage()


def test_an_attribute_replaced_by_someone_else_is_left_alone(vllm_omni: Path, caplog: pytest.LogCaptureFixture) -> None:
    modeling = _mod("modeling_magi2")

    class TheirNorm(torch.nn.Module):
        pass

    modeling.MultiModalityRMSNorm = TheirNorm
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    assert _swapped(modeling) == {
        "attention": True,
        "moe": True,
        "rmsnorm": False,
        "mhc": True,
        "qk_norm_rope": True,
        "output_gate": True,
        "shared_experts": True,
    }
    assert modeling.MultiModalityRMSNorm is TheirNorm
    warnings = [r.getMessage() for r in _records(caplog) if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "rmsnorm left as it is" in warnings[0] and "TheirNorm" in warnings[0]


def test_a_changed_call_signature_is_left_alone(vllm_omni: Path, caplog: pytest.LogCaptureFixture) -> None:
    modeling = _mod("modeling_magi2")
    attention = _mod("attention")

    def packed_attention_with_sink(
        q: Any, k: Any, v: Any, varlen: Any, *, softcap: float = -1.0, sink: Any = None, window: int = 0
    ) -> Any:
        raise AssertionError("not called")

    attention.packed_attention_with_sink = packed_attention_with_sink  # as if vllm-omni 0.30.x had changed it
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    assert _swapped(modeling) == {
        "attention": False,
        "moe": True,
        "rmsnorm": True,
        "mhc": True,
        "qk_norm_rope": True,
        "output_gate": True,
        "shared_experts": True,
    }
    (warning,) = [r.getMessage() for r in _records(caplog) if r.levelno == logging.WARNING]
    assert "window" in warning and "signature" in warning


def test_an_mhc_method_replaced_by_someone_else_is_left_alone(
    vllm_omni: Path, caplog: pytest.LogCaptureFixture
) -> None:
    modeling = _mod("modeling_magi2")

    def _connect(self: Any, streams: Any, output: Any, branch: str, logits: Any) -> Any:
        raise AssertionError("not called")

    modeling.Magi2TransformerLayer._connect = _connect
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    assert _swapped(modeling) == {
        "attention": True,
        "moe": True,
        "rmsnorm": True,
        "mhc": False,
        "qk_norm_rope": True,
        "output_gate": True,
        "shared_experts": True,
    }
    assert modeling.Magi2TransformerLayer._connect is _connect
    assert modeling.Magi2TransformerLayer._branch_logits.__module__ == f"{PKG}.modeling_magi2"  # all or none
    (warning,) = [r.getMessage() for r in _records(caplog) if r.levelno == logging.WARNING]
    assert "mhc left as it is" in warning and "_connect" in warning


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("modalities", [3, 1])
@torch.no_grad()
def test_mhc_methods_match_upstreams_within_the_contract(vllm_omni: Path, dtype: torch.dtype, modalities: int) -> None:
    """One real layer's mHC, both branches, through vllm-omni's own methods and through the swapped
    ones on the same parameters: the branch input and the mixed streams within operators.md §5.4
    (the rules judge vllm-omni's result as the reference), the coefficients within one BF16 ULP."""
    from magi2_core.contracts import acceptance as acc
    from magi2_core.testing import call_record

    modeling, layers = _mod("modeling_magi2"), _mod("layers")
    cfg = _small_config(dtype)
    layer = modeling.Magi2PreviewTransformer(cfg).block.layers[0 if modalities == 3 else 1]
    layer.load_state_dict(_random_checkpoint(layer, seed=13, scale=0.3))
    assert layer.mhc_norm.num_modality == modalities
    upstream = {m: getattr(modeling.Magi2TransformerLayer, m) for m in METHODS}
    t = 29
    dispatcher = layers.ModalityDispatcher(_coords_and_modalities(t)[1].clamp(max=2), 3)
    g = torch.Generator().manual_seed(2)
    streams = torch.randn(t, cfg.mhc.num_streams, cfg.hidden_size, generator=g, dtype=torch.float64).to(dtype)
    output = torch.randn(t, cfg.hidden_size, generator=g, dtype=torch.float64).to(dtype)
    for branch in ("attn", "mlp"):
        logits = upstream["_branch_logits"](layer, streams, branch, dispatcher)
        want_in = upstream["_branch_input"](layer, streams, branch, logits)
        want_out = upstream["_connect"](layer, streams, output, branch, logits)
        ours = MHCLayerMethods._branch_logits(layer, streams, branch, dispatcher)
        got_in = MHCLayerMethods._branch_input(layer, streams, branch, ours)
        got_out = MHCLayerMethods._connect(layer, streams, output, branch, ours)
        verdict = acc.accept_mhc_branch_input(got_in, want_in, streams)
        assert verdict, f"{branch}: {verdict}"
        post, res = layer.mhc_handler.compute_post_residual(
            (getattr(layer, f"mhc_alpha_post_{branch}"), getattr(layer, f"mhc_bias_post_{branch}"), logits[1]),
            (getattr(layer, f"mhc_alpha_res_{branch}"), getattr(layer, f"mhc_bias_res_{branch}"), logits[2]),
            out_dtype=dtype,
        )
        for name, a, b in (("post", ours[1], post), ("residual", ours[2], res)):
            verdict = acc.accept_mhc_coefficients(a, b, name)
            assert verdict, f"{branch}: {verdict}"
        verdict = acc.accept_mhc_mix(got_out, want_out, call_record("mhc_mix", streams, output, post, res))
        assert verdict, f"{branch}: {verdict}"


def _shared_experts_case(dtype: torch.dtype, sizes: tuple[int, int, int]) -> tuple[Any, torch.Tensor, Any]:
    """A real MoE layer of the small config with random weights, its normalized input in modality order
    (``sizes`` tokens per modality) and the dispatcher of that order."""
    modeling, layers = _mod("modeling_magi2"), _mod("layers")
    moe_layer = modeling.Magi2PreviewTransformer(_small_config(dtype)).block.layers[1].mlp
    assert type(moe_layer).__name__ == "Magi2MultiHeadMoELayer"
    moe_layer.load_state_dict(_random_checkpoint(moe_layer, seed=sum(sizes), scale=0.4))
    modality = torch.cat([torch.full((n,), m) for m, n in enumerate(sizes)])
    dispatcher = layers.ModalityDispatcher(modality, 3)
    g = torch.Generator().manual_seed(len(modality))
    normalized = (torch.randn(len(modality), 64, generator=g, dtype=torch.float64) * 3).to(dtype)
    return moe_layer, normalized, dispatcher


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("sizes", [(17, 5, 3), (0, 9, 1)], ids=["three-groups", "an-empty-group"])
@torch.no_grad()
def test_shared_experts_are_upstreams_bit_for_bit(
    vllm_omni: Path, dtype: torch.dtype, sizes: tuple[int, int, int]
) -> None:
    """The shared experts with SwiGLU7 applied to each half equal vllm-omni's concatenated form exactly,
    on inputs large enough (x3) that both clamps of SwiGLU7 are reached."""
    upstream = _mod("modeling_magi2").Magi2MultiHeadMoELayer._shared_experts
    moe_layer, normalized, dispatcher = _shared_experts_case(dtype, sizes)
    want = upstream(moe_layer, normalized, dispatcher)
    got = SharedExpertsMethods._shared_experts(moe_layer, normalized, dispatcher)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)
    fc1 = moe_layer.shared_expert_fc1(normalized).float()
    assert (fc1[:, ::2] > 7).any() and (fc1[:, 1::2].abs() > 7).any()  # the clamps were exercised


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@torch.no_grad()
def test_compiled_shared_experts_are_compiled_upstreams_bit_for_bit(vllm_omni: Path, device: str) -> None:
    """Compiled by inductor, both forms still give the same bits: the per-element operations are the same
    (on a GPU inductor writes Triton kernels, on the CPU C++)."""
    torch._dynamo.reset()
    upstream = _mod("modeling_magi2").Magi2MultiHeadMoELayer._shared_experts
    moe_layer, normalized, dispatcher = _shared_experts_case(torch.bfloat16, (21, 6, 4))
    moe_layer, normalized = moe_layer.to(device), normalized.to(device)
    dispatcher = _mod("layers").ModalityDispatcher(dispatcher.modality_mapping.to(device), 3)
    want = torch.compile(upstream, fullgraph=True)(moe_layer, normalized, dispatcher)
    got = torch.compile(SharedExpertsMethods._shared_experts, fullgraph=True)(moe_layer, normalized, dispatcher)
    assert torch.equal(got, want)


def test_shared_experts_swap_is_left_off_when_asked(
    vllm_omni: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="magi2_core")
    monkeypatch.setenv("MAGI2_VLLM_OMNI_SHARED_EXPERTS", "0")
    integ.register()
    swapped = _swapped(_mod("modeling_magi2"))
    assert not swapped.pop("shared_experts") and all(swapped.values())
    said = "shared_experts left as it is (MAGI2_VLLM_OMNI_SHARED_EXPERTS=0)"
    assert any(said in r.getMessage() for r in _records(caplog))


@pytest.mark.parametrize(
    ("op", "variable"),
    [("qk_norm_rope", "MAGI2_VLLM_OMNI_QK_ROPE"), ("output_gate", "MAGI2_VLLM_OMNI_OUTPUT_GATE")],
)
def test_an_attention_method_swap_is_automatic_only_where_a_fused_provider_serves(
    vllm_omni: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, op: str, variable: str
) -> None:
    """Unset (``auto``): on this CPU the typical call resolves to the reference, so the method stays
    vllm-omni's; where the Triton kernel serves it, it is swapped, and put back by ``unregister``; ``0``
    keeps it off with the others on."""
    from magi2_core.integrations.vllm_omni import plugin

    monkeypatch.delenv(variable)
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    assert _swapped(_mod("modeling_magi2"))[op] is False
    said = [r.getMessage() for r in caplog.records if f"{op} left as it is" in r.getMessage()]
    assert len(said) == 1 and f"({variable}=auto)" in said[0] and "'reference'" in said[0], said
    integ.unregister()
    real = plugin._describe_provider
    monkeypatch.setattr(
        plugin, "_describe_provider", lambda name, mod: ("triton here", ("triton",)) if name == op else real(name, mod)
    )
    integ.register()
    assert _swapped(_mod("modeling_magi2"))[op] is True
    integ.unregister()
    assert not any(_swapped(_mod("modeling_magi2")).values())  # every original put back
    monkeypatch.setenv(variable, "0")
    integ.register()
    swapped = _swapped(_mod("modeling_magi2"))
    assert swapped.pop(op) is False and all(swapped.values()), swapped


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layer_index", [0, 1], ids=["multimodal", "moe"])
@torch.no_grad()
def test_project_matches_upstreams_within_the_contract(vllm_omni: Path, dtype: torch.dtype, layer_index: int) -> None:
    """One real layer's attention ``project`` through vllm-omni's own method and through the swapped one, on
    the same parameters and inputs: q and k within the ``qk_norm_rope`` rule (vllm-omni's result judged as
    the reference), v and the gates identical."""
    from magi2_core.contracts import acceptance as acc
    from magi2_core.testing import call_record

    modeling, layers = _mod("modeling_magi2"), _mod("layers")
    cfg = _small_config(dtype)
    model = modeling.Magi2PreviewTransformer(cfg)
    model.load_state_dict(_random_checkpoint(model, seed=21, scale=0.3))
    attention = model.block.layers[layer_index].attention
    t = 29
    coords, modality = _coords_and_modalities(t)
    g = torch.Generator().manual_seed(4)
    order = torch.randperm(t, generator=g)  # interleaved modalities: inverse_permute is a real gather
    dispatcher = layers.ModalityDispatcher(modality.clamp(max=2)[order], 3)
    assert not torch.equal(dispatcher.inv_permute_mapping, torch.arange(t))
    rope = model.pre_adapter.rope(coords[order])
    assert rope.shape[1] < cfg.head_dim  # MAGI-2 rotates part of each head
    hidden = torch.randn(t, cfg.hidden_size, generator=g, dtype=torch.float64).to(dtype)
    want = modeling.Magi2Attention.project(attention, hidden, rope, dispatcher)
    got = AttentionProjectMethods.project(attention, hidden, rope, dispatcher)
    assert torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])  # v and the gates
    qkv = attention.linear_qkv(attention.pre_norm(hidden, dispatcher), dispatcher)
    sizes = list(dispatcher.group_size_cpu) if attention.q_norm.num_modality > 1 else None
    for which, norm, columns, heads in (
        ("q", attention.q_norm, slice(0, attention.q_size), attention.num_heads_q),
        ("k", attention.k_norm, slice(attention.q_size, attention.q_size + attention.kv_size), attention.num_heads_kv),
    ):
        x = qkv[:, columns].view(t, heads, cfg.head_dim)
        call = call_record(
            "qk_norm_rope", x, norm.weight, rope, eps=norm.eps, modality_sizes=sizes,
            index=dispatcher.inv_permute_mapping, out_dtype=dtype,
        )  # fmt: skip
        a, b = got[0 if which == "q" else 1], want[0 if which == "q" else 1]
        assert a.dtype == b.dtype == dtype and a.shape == b.shape
        verdict = acc.accept_qk_norm_rope(a, b, call)
        assert verdict, f"{which}: {verdict}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layer_index", [0, 1], ids=["multimodal", "moe"])
@torch.no_grad()
def test_output_matches_upstreams_within_the_contract(vllm_omni: Path, dtype: torch.dtype, layer_index: int) -> None:
    """One real layer's attention ``output`` through vllm-omni's own method and through the swapped one, on
    the same parameters and an interleaved modality order (``permute`` a real gather): the gated rows
    within the ``output_gate`` rule (vllm-omni's eager result judged as the reference), and the output
    projection of each; a mutation (no gather) fails the rule."""
    from magi2_core.contracts import acceptance as acc

    modeling, layers = _mod("modeling_magi2"), _mod("layers")
    cfg = _small_config(dtype)
    model = modeling.Magi2PreviewTransformer(cfg)
    model.load_state_dict(_random_checkpoint(model, seed=23, scale=0.3))
    attention = model.block.layers[layer_index].attention
    t = 29
    _, modality = _coords_and_modalities(t)
    g = torch.Generator().manual_seed(5)
    order = torch.randperm(t, generator=g)
    dispatcher = layers.ModalityDispatcher(modality.clamp(max=2)[order], 3)
    assert not torch.equal(dispatcher.permute_mapping, torch.arange(t))
    o = torch.randn(t, attention.num_heads_q, attention.head_dim, generator=g, dtype=torch.float64).to(dtype)
    gates = (3 * torch.randn(t, attention.num_heads_q, 1, generator=g, dtype=torch.float64)).to(dtype)
    captured: list[torch.Tensor] = []
    with _capturing_inputs(attention.linear_proj, captured):
        want = modeling.Magi2Attention.output(attention, o, gates, dispatcher)
        got = AttentionOutputMethods.output(attention, o, gates, dispatcher)
    theirs, ours = (c.view(t, attention.num_heads_q, attention.head_dim) for c in captured)
    assert ours.dtype == theirs.dtype == dtype and got.shape == want.shape and got.dtype == want.dtype
    verdict = acc.accept_output_gate(ours, theirs, gates)
    assert verdict, str(verdict)
    ungathered = (o.float() * torch.sigmoid(gates.float())).to(dtype)
    assert not acc.accept_output_gate(ungathered, theirs, gates)
    assert torch.equal(got, attention.linear_proj(ours.reshape(t, -1), dispatcher))


@contextlib.contextmanager
def _capturing_inputs(module: torch.nn.Module, into: list[torch.Tensor]) -> Iterator[None]:
    """Record the first positional input of each call of ``module`` (the output projection's input)."""
    handle = module.register_forward_pre_hook(lambda _m, args: into.append(args[0].detach().clone()))
    try:
        yield
    finally:
        handle.remove()


def test_compile_regions_with_the_swaps_match_eager(vllm_omni: Path) -> None:
    """vllm-omni's ``compile_regions`` (fullgraph) over layers whose mHC, norms, MoE and attention run
    on magi2-core: the custom ops stay opaque in the regions and the output is the eager one."""
    torch._dynamo.reset()
    modeling = _mod("modeling_magi2")
    integ.register()
    model = modeling.Magi2PreviewTransformer(_small_config())
    model.load_state_dict(_random_checkpoint(model, seed=8, scale=0.05))
    want = _run_model(model, model.config)
    model.compile_regions(fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(_run_model(model, model.config), want, rtol=1e-6, atol=1e-6)


def test_plugin_is_installed_as_a_vllm_general_plugin() -> None:
    found = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert [ep.value for ep in found if ep.dist is not None and ep.dist.name == "magi2-core"] == [
        "magi2_core.integrations.vllm_omni:register"
    ]


def test_plugin_lines_reach_vllms_log_handlers(vllm_omni: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM configures only its own logger; the plugin lends its handlers to ``magi2_core`` when
    nothing else would print the INFO lines."""
    ours, vllm_logger = logging.getLogger("magi2_core"), logging.getLogger("vllm")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    monkeypatch.setattr(ours, "propagate", False)  # as if no handler were configured above us
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    monkeypatch.setattr(vllm_logger, "handlers", [handler])
    integ.register()
    _mod("modeling_magi2")
    assert ours.handlers == [handler] and ours.level == logging.INFO
    assert len([line for line in lines if "now runs on magi2-core" in line]) == 7


# ---------------------------------------------------------------------------------------------
# checkpoints: names, shapes, dtypes; strict loading; vllm-omni's load_weights
# ---------------------------------------------------------------------------------------------
def test_release_config_checkpoint_layout_is_upstreams(vllm_omni: Path) -> None:
    """The release's dims (12 heads x 256 experts, d 3072, 40 layers), built on the meta device."""
    modeling = _mod("modeling_magi2")
    with torch.device("meta"):
        upstream = modeling.Magi2PreviewTransformer()
    integ.register()
    with torch.device("meta"):
        ours = modeling.Magi2PreviewTransformer()
    assert isinstance(ours.block.layers[2].mlp.moe_mlp, integ.Magi2MultiHeadMoE)
    assert list(_layout(ours).items()) == list(_layout(upstream).items())  # names, order, shapes, dtypes
    assert _layout(ours)["block.layers.2.mlp.moe_mlp.W_gate"] == ((12 * 256, 256, 1280), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_checkpoint_loads_strictly_and_round_trips(vllm_omni: Path, dtype: torch.dtype) -> None:
    modeling = _mod("modeling_magi2")
    cfg = _small_config(dtype)
    ckpt = _random_checkpoint(modeling.Magi2PreviewTransformer(cfg))
    integ.register()
    model = modeling.Magi2PreviewTransformer(cfg)
    model.load_state_dict(ckpt, strict=True)
    back = model.state_dict()
    assert list(back) == list(ckpt)
    for name, tensor in ckpt.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name


def _ep_group(monkeypatch: pytest.MonkeyPatch, world: int, rank: int) -> None:
    """vllm-omni's EP group getter answers (world, rank) with no process group: enough to build and
    load a rank's layers (slicing is local); vllm-omni's own MoE and ours both ask it."""
    parallel, mh_moe = _mod("parallel"), _mod("mh_moe")
    group = parallel.Magi2ParallelGroup(None, world, rank)
    monkeypatch.setattr(parallel, "get_magi2_ep_group", lambda: group)
    monkeypatch.setattr(mh_moe, "get_magi2_ep_group", lambda: group)


def _expected_after_load_weights(model: torch.nn.Module, ckpt: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What vllm-omni's loader leaves: each MoE tensor sliced for this rank, the EMA bias in expert_bias."""
    want = {}
    for name in ckpt:
        source = name.replace("expert_bias", "expert_bias_ema") if name.endswith("router.expert_bias") else name
        value = ckpt[source]
        if ".moe_mlp." in name:
            moe = model.get_submodule(name.split(".moe_mlp.")[0] + ".moe_mlp")
            value = moe.ep_slice(value)
        want[name] = value
    return want


@pytest.mark.parametrize("built", ["after-swap", "before-swap", "no-plugin"])
@pytest.mark.parametrize(("world", "rank"), [(1, 0), (2, 1)], ids=["single", "ep2-rank1-phantom"])
def test_load_weights_slices_and_copies_the_ema_bias(
    vllm_omni: Path, monkeypatch: pytest.MonkeyPatch, built: str, world: int, rank: int
) -> None:
    """vllm-omni's ``load_weights`` on a model built after the swap (our layers), before it
    (vllm-omni's own layers, which must still load as vllm-omni loads them) and without the plugin.
    Rank 1 of 2 with 3 MoE heads holds one real and one phantom head."""
    modeling = _mod("modeling_magi2")
    base = _small_config(torch.bfloat16)
    cfg = dataclasses.replace(base, hidden_size=48, num_query_groups=3, moe=dataclasses.replace(base.moe, num_heads=3))
    ckpt = _random_checkpoint(modeling.Magi2PreviewTransformer(cfg))  # the full checkpoint: one rank's view of it
    _ep_group(monkeypatch, world, rank)
    if built == "before-swap":
        model = modeling.Magi2PreviewTransformer(cfg)
        integ.register()
    else:
        if built == "after-swap":
            integ.register()
        model = modeling.Magi2PreviewTransformer(cfg)
    moe = model.block.layers[1].mlp.moe_mlp
    ours = built == "after-swap"
    assert (type(moe) is integ.Magi2MultiHeadMoE) == ours and moe.local_num_heads == (2 if world == 2 else 3)
    loaded = model.load_weights((f"transformer.{n}", t) for n, t in ckpt.items())
    assert loaded == set(ckpt)
    want = _expected_after_load_weights(model, ckpt)
    got = model.state_dict()
    for name in ckpt:
        assert torch.equal(got[name], want[name]), name
    if world == 2:
        assert not got["block.layers.1.mlp.moe_mlp.W_up"][8:].any()  # the phantom head's rows stay zero


@pytest.mark.parametrize(("ema", "main"), [("ema", "main"), ("EMA", " Main ")])
def test_router_bias_source_selects_the_bias_as_upstream(
    vllm_omni: Path, monkeypatch: pytest.MonkeyPatch, ema: str, main: str
) -> None:
    upstream, ours = _moe_pair(torch.float32)
    bias = torch.randn(ours.router.expert_bias.shape) * 3  # decides the selection
    upstream.router.expert_bias.copy_(bias)
    ours.router.expert_bias.copy_(bias)
    x = torch.randn(33, 64)
    outputs = {}
    with torch.no_grad():
        for spelled in (ema, main, ema):  # no reload_config(): both read it on every forward
            monkeypatch.setenv("MAGI2_ROUTER_BIAS_SOURCE", spelled)
            want = upstream(x)
            torch.testing.assert_close(ours(x), want, rtol=2e-5, atol=2e-5)
            outputs[spelled] = want
    assert not torch.allclose(outputs[ema], outputs[main])  # the two biases do select differently


@torch.no_grad()
def test_router_bias_source_set_after_the_swap_agrees_with_plugin_off(
    vllm_omni: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap resolves providers when the model module is imported, which parses every variable: a
    setting made after that, in any sequence, is what the next forward of either layer uses."""
    monkeypatch.delenv("MAGI2_ROUTER_BIAS_SOURCE", raising=False)
    integ.register()
    modeling = _mod("modeling_magi2")  # the swap: every MAGI2_* variable parsed here
    assert modeling.Magi2MultiHeadMoE is integ.Magi2MultiHeadMoE
    mh_moe = _mod("mh_moe")
    dims = {"hidden_size": 64, "num_heads": 4, "num_experts": 8, "top_k": 2, "expert_intermediate_size": 32}
    cfg = mh_moe.Magi2MultiHeadMoEConfig(params_dtype=torch.float32, route_scale=4.9, **dims)
    on, off = modeling.Magi2MultiHeadMoE(cfg), mh_moe.Magi2MultiHeadMoE(cfg)  # plugin on / vllm-omni's own
    state = _moe_state(off) | {"router.expert_bias": torch.randn(off.router.expert_bias.shape) * 3}
    on.load_state_dict(state)
    off.load_state_dict(state)
    x = torch.randn(33, 64)
    torch.testing.assert_close(on(x), off(x), rtol=2e-5, atol=2e-5)  # a first forward with the default
    seen = []
    for value in ("main", "", "MAIN", "ema", " main ", None):
        if value is None:
            monkeypatch.delenv("MAGI2_ROUTER_BIAS_SOURCE")
        else:
            monkeypatch.setenv("MAGI2_ROUTER_BIAS_SOURCE", value)
        want = off(x)
        torch.testing.assert_close(on(x), want, rtol=2e-5, atol=2e-5, msg=lambda m, v=value: f"{v!r}: {m}")
        seen.append(want)
    assert not torch.allclose(seen[0], seen[1])  # main and the default select differently here


def test_bad_router_bias_source_names_the_accepted_values(vllm_omni: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    upstream, ours = _moe_pair(torch.float32)
    x = torch.randn(5, 64)
    with torch.no_grad():
        ours(x)
        monkeypatch.setenv("MAGI2_ROUTER_BIAS_SOURCE", "average")  # vllm-omni would silently take "ema"
        with pytest.raises(ConfigError, match="MAGI2_ROUTER_BIAS_SOURCE") as info:
            ours(x)  # refused at the next forward, not ignored
        assert "ema | main" in str(info.value)
        with pytest.raises(ConfigError, match="MAGI2_ROUTER_BIAS_SOURCE"):
            m2.reload_config()
        monkeypatch.setenv("MAGI2_ROUTER_BIAS_SOURCE", "main")
        torch.testing.assert_close(ours(x), upstream(x), rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------------------------------------
# numerics against vllm-omni's torch paths, at vllm-omni's tolerances
# ---------------------------------------------------------------------------------------------
def _moe_pair(dtype: torch.dtype, **options: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """vllm-omni's MoE layer and ours (4 heads x 8 experts, d 16, I 32), loaded with the same
    unit-scale weights."""
    mh_moe = _mod("mh_moe")
    dims = {"hidden_size": 64, "num_heads": 4, "num_experts": 8, "top_k": 2, "expert_intermediate_size": 32}
    cfg = mh_moe.Magi2MultiHeadMoEConfig(params_dtype=dtype, **(dims | {"route_scale": 4.9} | options))
    upstream, ours = mh_moe.Magi2MultiHeadMoE(cfg), integ.Magi2MultiHeadMoE(cfg)
    state = _moe_state(upstream)
    upstream.load_state_dict(state)
    ours.load_state_dict(state)
    return upstream, ours


def _moe_state(layer: torch.nn.Module, g: torch.Generator | None = None) -> dict[str, torch.Tensor]:
    fan_in = {"W_gate": layer.d_head, "W_up": layer.d_head, "W_down": layer.d_expert}
    return {
        n: (torch.randn(t.shape, generator=g, dtype=torch.float64) * fan_in.get(n, 11) ** -0.5).to(t.dtype)
        for n, t in layer.state_dict().items()
    }


def _exactly(upstream: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """vllm-omni's own layer evaluated in float64 (its routing stays FP32, so the routes are the same)."""
    return copy.deepcopy(upstream).double()(x.double())


def _assert_bf16_moe(got: torch.Tensor, theirs: torch.Tensor, exact: torch.Tensor, *, unit_scale: bool) -> None:
    """BF16 MoE outputs: vllm-omni's torch path rounds every GEMM and each route to BF16, magi2-core
    keeps FP32 until the activation and sums the routes in FP32 (the fused kernel's roundings), so
    the two are compared through the exact result: ours no less exact than vllm-omni's (relative L2)
    and, for one unit-scale route (the setting of vllm-omni's BF16 expert-kernel test), within that
    test's tolerance ``rtol = atol = 2e-2`` everywhere."""

    def err(y: torch.Tensor) -> float:
        return float((y.double() - exact).norm() / exact.norm())

    assert err(got) <= err(theirs) and err(got) < 1e-2, (
        f"relative L2 error {err(got):.2e}, vllm-omni's {err(theirs):.2e}"
    )
    if unit_scale:
        torch.testing.assert_close(got.double(), exact, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    "options",
    [{}, {"score_func": "softmax"}, {"route_norm": False}, {"score_func": "softmax", "route_norm": False}],
    ids=["release", "softmax", "unnormalised", "softmax-unnormalised"],
)
@torch.no_grad()
def test_fp32_moe_matches_upstream(vllm_omni: Path, options: dict[str, Any]) -> None:
    """vllm-omni's config allows softmax scores and unnormalised weights (the release uses neither)."""
    upstream, ours = _moe_pair(torch.float32, **options)
    x = torch.randn(41, 64, dtype=torch.float64).float()
    torch.testing.assert_close(ours(x), upstream(x), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(
    "options", [{"top_k": 1, "route_scale": 1.0}, {}], ids=["one-unit-scale-route", "release-routing"]
)
@torch.no_grad()
def test_bf16_moe_is_as_exact_as_upstream(vllm_omni: Path, options: dict[str, Any]) -> None:
    upstream, ours = _moe_pair(torch.bfloat16, **options)
    x = torch.randn(41, 64, dtype=torch.float64).bfloat16()
    _assert_bf16_moe(ours(x), upstream(x), _exactly(upstream, x), unit_scale=bool(options))


@torch.no_grad()
def test_moe_cast_to_bf16_reads_the_router_in_fp32_as_upstream(vllm_omni: Path) -> None:
    """``.to(torch.bfloat16)`` casts the FP32 router weight and biases too; vllm-omni's layer reads
    them back in FP32 (``gate.float()``, the BF16 bias promoted), and so must ours."""
    upstream, ours = _moe_pair(torch.bfloat16)
    upstream.to(torch.bfloat16)
    ours.to(torch.bfloat16)
    assert ours.gate.dtype == ours.router.expert_bias_ema.dtype == torch.bfloat16
    x = torch.randn(37, 64, dtype=torch.float64).bfloat16()
    _assert_bf16_moe(ours(x), upstream(x), _exactly(upstream, x), unit_scale=False)


@pytest.mark.parametrize("out_dtype", [None, torch.float32], ids=["out-x-dtype", "out-fp32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("modalities", "patterns"), [(1, 1), (3, 1), (3, 2)])
@torch.no_grad()
def test_rmsnorm_matches_upstream(
    vllm_omni: Path, modalities: int, patterns: int, dtype: torch.dtype, out_dtype: torch.dtype | None
) -> None:
    layers = _mod("layers")
    upstream = layers.MultiModalityRMSNorm(32, num_modality=modalities, num_patterns=patterns, out_dtype=out_dtype)
    ours = integ.MultiModalityRMSNorm(32, num_modality=modalities, num_patterns=patterns, out_dtype=out_dtype)
    weight = torch.randn(upstream.weight.shape) * 0.2
    upstream.weight.copy_(weight)
    ours.weight.copy_(weight)
    modality = torch.tensor([0, 0, 1, 2, 2, 2, 1, 0, 2, 1, 1]).sort().values % modalities
    dispatcher = layers.ModalityDispatcher(modality, 3)
    x = torch.randn(11, *((patterns,) if patterns > 1 else ()), 32, dtype=torch.float64)[..., :32].to(dtype)
    got, want = ours(x, dispatcher), upstream(x, dispatcher)
    assert got.dtype == want.dtype
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    else:  # one BF16 rounding (the FP32 results agree to 1e-6, so a rounding boundary may fall between)
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("sinks", [0, 1, 2])
@pytest.mark.parametrize(("heads_kv", "softcap"), [(4, -1.0), (2, -1.0), (4, 3.0)], ids=["mha", "gqa", "softcap"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_attention_matches_upstream(
    vllm_omni: Path, dtype: torch.dtype, heads_kv: int, softcap: float, sinks: int
) -> None:
    attention = _mod("attention")
    cu = torch.tensor([0, 5, 6, 23], dtype=torch.int32)
    q = torch.randn(23, 4, 16, dtype=torch.float64).to(dtype)
    k, v = (torch.randn(23, heads_kv, 16, dtype=torch.float64).to(dtype) for _ in range(2))
    sink = torch.randn(sinks, 4) if sinks else None
    for varlen in (attention.VarlenHandler(cu, cu), attention.VarlenHandler(cu, cu, 17, 17)):
        want = attention.packed_attention_with_sink(q, k, v, varlen, softcap=softcap, sink=sink)
        got = integ.packed_attention_with_sink(q, k, v, varlen, softcap=softcap, sink=sink)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def _coords_and_modalities(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed MAGI-2 coordinates (position, grid size, reference size) and modality ids, video first."""
    video, audio = t // 2, t // 4
    grid = torch.tensor([2.0, 3.0, 4.0])
    pos = torch.stack([torch.arange(video) // 12 % 2, torch.arange(video) // 4 % 3, torch.arange(video) % 4], -1)
    coords = torch.ones(t, 9)
    coords[:video, :3], coords[:video, 3:6], coords[:video, 6:] = pos.float(), grid, grid
    coords[video : video + audio, 0] = torch.arange(audio).float()
    coords[video : video + audio, 3] = coords[video : video + audio, 6] = float(audio)
    modality = torch.tensor([0] * video + [1] * audio + [2] * (t - video - audio - 1) + [3])  # last: a time token
    return coords, modality


def _run_model(model: torch.nn.Module, cfg: Any, t: int = 24, seed: int = 9) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    coords, modality = _coords_and_modalities(t)
    packed = torch.randn(t, 8, generator=g)
    cu = torch.tensor([0, 15, t], dtype=torch.int32)  # two packed sequences
    time_tokens = torch.randn(t, 3, generator=g)
    with torch.no_grad():
        return model(packed, coords, modality, _mod("attention").VarlenHandler(cu, cu, 15, 15), time_tokens)


@pytest.mark.parametrize(
    ("dtype", "sinks", "softcap", "kv", "tol"),
    [
        (torch.float32, 1, -1.0, 4, 2e-5),
        (torch.float32, 2, 3.0, 2, 2e-5),
        (torch.bfloat16, 1, -1.0, 4, 2e-2),
        (torch.bfloat16, 2, 3.0, 2, 2e-2),
    ],
    ids=["fp32", "fp32-2sinks-softcap-gqa", "bf16", "bf16-2sinks-softcap-gqa"],
)
@torch.no_grad()
def test_swapped_layers_match_upstream_layer_by_layer(
    vllm_omni: Path, dtype: torch.dtype, sinks: int, softcap: float, kv: int, tol: float
) -> None:
    """Each real ``Magi2TransformerLayer`` built with the swapped operators gets the input that
    vllm-omni's own layer got (so a BF16 rounding difference cannot flip a later route) and must give
    vllm-omni's output; the update (output minus input) is compared, relative to its norm."""
    modeling, layers = _mod("modeling_magi2"), _mod("layers")
    cfg = _small_config(dtype, sinks=sinks, softcap=softcap, kv_groups=kv)
    upstream = modeling.Magi2PreviewTransformer(cfg)
    ckpt = _random_checkpoint(upstream)
    upstream.load_state_dict(ckpt, strict=True)
    t = 29
    coords, modality = _coords_and_modalities(t)
    dispatcher = layers.ModalityDispatcher(modality.clamp(max=2), 3)
    rope = upstream.pre_adapter.rope(coords)
    cu = torch.tensor([0, 7, 8, 20, t], dtype=torch.int32)
    varlen = _mod("attention").VarlenHandler(cu, cu)
    steps = [dispatcher.permute(torch.randn(t, cfg.virtual_width, dtype=torch.float64).to(dtype))]
    for layer in upstream.block.layers:  # before the swap: vllm-omni's attention function too
        steps.append(layer(steps[-1], rope, varlen, dispatcher, [t]))
    integ.register()
    ours = modeling.Magi2PreviewTransformer(cfg)
    ours.load_state_dict(ckpt, strict=True)
    for i, layer in enumerate(ours.block.layers):
        x, want = steps[i], steps[i + 1]
        got = layer(x, rope, varlen, dispatcher, [t])
        assert got.dtype == want.dtype and got.shape == want.shape, i
        err = float((got.double() - want.double()).norm() / (want.double() - x.double()).norm())
        assert err < tol, f"layer {i}: relative error of the layer's update {err:.2e} (tolerance {tol:.0e})"


@pytest.mark.parametrize(
    ("dtype", "rtol", "atol"), [(torch.float32, 1e-5, 1e-6), (torch.bfloat16, 2e-2, 2e-2)], ids=["fp32", "bf16"]
)
def test_tiny_model_plugin_on_matches_plugin_off(vllm_omni: Path, dtype: torch.dtype, rtol: float, atol: float) -> None:
    """The model-level check. vllm-omni's pinned tiny-model golden lives in its test tree, which the
    wheel does not ship; in its place: the same model and weights (``randn * 0.02``, as vllm-omni's own
    tiny-model tests initialise), plugin off and on, whole output compared: FP32 at that golden's
    tolerance, BF16 at vllm-omni's BF16 kernel tolerance (three layers of BF16 roundings between)."""
    modeling = _mod("modeling_magi2")
    cfg = _small_config(dtype)
    off = modeling.Magi2PreviewTransformer(cfg)
    ckpt = _random_checkpoint(off, seed=21, scale=0.02)
    off.load_state_dict(ckpt, strict=True)
    want = _run_model(off, cfg)  # before the swap: vllm-omni looks its attention function up at each call
    integ.register()
    on = modeling.Magi2PreviewTransformer(cfg)
    on.load_state_dict(ckpt, strict=True)
    assert isinstance(on.block.layers[1].mlp.moe_mlp, integ.Magi2MultiHeadMoE)
    got = _run_model(on, cfg)
    assert want.abs().max() > 0.1  # not a vanishing output
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)


def test_layers_cast_to_bf16_run_as_upstream(vllm_omni: Path) -> None:
    """Every layer's attention and MLP cast to BF16 (the swapped norms, sinks, router and biases
    among them) run as vllm-omni's do. A cast of the whole model or layer is not tested: vllm-omni's
    own FP32 embedders and mHC matmuls refuse BF16 weights."""

    def cast(model: torch.nn.Module) -> torch.nn.Module:
        for layer in model.block.layers:
            layer.attention.to(torch.bfloat16)
            layer.mlp.to(torch.bfloat16)
        return model

    modeling = _mod("modeling_magi2")
    cfg = _small_config(torch.bfloat16)
    off = modeling.Magi2PreviewTransformer(cfg)
    ckpt = _random_checkpoint(off, seed=4, scale=0.02)
    off.load_state_dict(ckpt, strict=True)
    want = _run_model(cast(off), cfg)
    integ.register()
    on = modeling.Magi2PreviewTransformer(cfg)
    on.load_state_dict(ckpt, strict=True)
    cast(on)
    assert on.block.layers[1].mlp.moe_mlp.gate.dtype == on.block.layers[0].attention.sinks.dtype == torch.bfloat16
    got = _run_model(on, cfg)
    assert want.abs().max() > 0.1
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


# ---------------------------------------------------------------------------------------------
# expert parallelism
# ---------------------------------------------------------------------------------------------
def _check_rank(got: torch.Tensor, theirs: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, theirs, rtol=2e-5, atol=2e-5, msg=lambda m: f"{what}: {m}")
    else:
        _assert_bf16_moe(got, theirs, exact, unit_scale=False)


def _ep_layers(cfg: Any, full: dict[str, torch.Tensor], group: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """vllm-omni's and our layer for ``group``'s rank, each loaded through its own ``ep_slice``."""
    upstream, ours = _mod("mh_moe").Magi2MultiHeadMoE(cfg, ep_group=group), integ.Magi2MultiHeadMoE(cfg, ep_group=group)
    for layer in (upstream, ours):
        layer.load_state_dict({n: layer.ep_slice(t) for n, t in full.items()})
    return upstream, ours


def _single(cfg: Any, g: torch.Generator | None = None) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """vllm-omni's layer on one rank with a fresh full checkpoint (what every EP rank slices)."""
    layer = _mod("mh_moe").Magi2MultiHeadMoE(cfg, ep_group=_mod("parallel").Magi2ParallelGroup(None, 1, 0))
    full = _moe_state(layer, g)
    layer.load_state_dict(full)
    return layer, full


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@torch.no_grad()
def test_tensor_parallel_ranks_match_upstream_without_a_process_group(vllm_omni: Path, dtype: torch.dtype) -> None:
    """Under TP every rank holds all tokens for its own heads and exchanges nothing: both layers run
    with a group of world 2 and no process group. vllm-omni's TP needs the heads to divide by TP."""
    cfg = _mod("mh_moe").Magi2MultiHeadMoEConfig(64, 4, 8, 2, 32, dtype, route_scale=4.9)
    single, full = _single(cfg)
    x = torch.randn(19, 64, dtype=torch.float64).to(dtype)
    exact = _exactly(single, x)
    for rank in (0, 1):
        group = _mod("parallel").Magi2ParallelGroup(None, 2, rank, replicated_sequence=True)
        upstream, ours = _ep_layers(cfg, full, group)
        cols = slice(rank * 32, (rank + 1) * 32)
        _check_rank(ours(x[:, cols]), upstream(x[:, cols]), exact[:, cols], f"rank {rank}")


def _ep_worker(rank: int, world: int, root: str, tokens: tuple[int, ...]) -> None:
    import torch.distributed as dist

    stubs.install(Path(root))
    try:
        group = _mod("parallel").Magi2ParallelGroup(dist.group.WORLD, world, rank)
        rows = slice(sum(tokens[:rank]), sum(tokens[: rank + 1]))
        for dtype in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(3)  # the same checkpoint and tokens on every rank
            cfg = _mod("mh_moe").Magi2MultiHeadMoEConfig(48, 3, 8, 2, 32, dtype, route_scale=4.9)
            single, full = _single(cfg, g)
            x = torch.randn(sum(tokens), 48, generator=g, dtype=torch.float64).to(dtype)
            upstream, ours = _ep_layers(cfg, full, group)
            assert ours.real_local_heads == (2, 1)[rank] and upstream.local_num_heads == 2
            with torch.no_grad():
                got, theirs = ours(x[rows]), upstream(x[rows])
                exact = _exactly(single, x)[rows]
            if tokens[rank]:
                _check_rank(got, theirs, exact, f"rank {rank} {dtype}")
            assert got.shape == theirs.shape == (tokens[rank], 48)
    finally:
        stubs.uninstall()


def _run_world(*args: Any) -> None:
    harness = sys.modules.get("dist_harness")
    if harness is None:
        spec = importlib.util.spec_from_file_location("dist_harness", DIST / "dist_harness.py")
        assert spec is not None and spec.loader is not None
        harness = importlib.util.module_from_spec(spec)
        sys.modules["dist_harness"] = harness
        spec.loader.exec_module(harness)
    harness.run_world(*args)


@pytest.mark.parametrize("tokens", [(9, 16), (24, 0)], ids=["uneven", "empty-rank"])
def test_expert_parallel_ranks_match_upstream(vllm_omni_root: Path, tokens: tuple[int, ...]) -> None:
    """Sequence-parallel layout on two gloo ranks: each rank sends its tokens to the heads' owners
    (vllm-omni's all-to-all vs magi2-core's); 3 heads leave rank 1 a phantom head, which vllm-omni
    computes on zeros and magi2-core never sends."""
    _run_world(2, _ep_worker, str(vllm_omni_root), tokens)


# ---------------------------------------------------------------------------------------------
# the layers without vllm-omni
# ---------------------------------------------------------------------------------------------
def test_varlen_attention_with_sink_matches_the_float64_oracle() -> None:
    import oracles

    cu = torch.tensor([0, 5, 5, 17], dtype=torch.int32)
    q, k, v = (torch.randn(17, 4, 16, dtype=torch.float64).to(torch.bfloat16) for _ in range(3))
    sink = torch.randn(2, 4)
    for s, cap in ((sink, -1.0), (sink, 3.0), (None, -1.0), (sink[:0], -1.0)):
        got = integ.varlen_attention_with_sink(
            q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=12, max_seqlen_k=12, softcap=cap, sink=s
        )
        want = oracles.attention(q, k, v, cu, cu, softcap=max(cap, 0.0), sinks=s).o
        torch.testing.assert_close(got.double(), want, rtol=1e-2, atol=8e-3)


@torch.no_grad()  # magi2 ops are forward-only
def test_norm_rejects_a_missing_dispatcher_and_ignores_it_for_one_modality() -> None:
    norm = integ.MultiModalityRMSNorm(8, num_modality=3)
    with pytest.raises(m2.InvalidValueError, match="modality_dispatcher"):
        norm(torch.randn(4, 8))
    single = integ.MultiModalityRMSNorm(8, out_dtype=torch.float32, dtype=torch.float32)
    x = torch.randn(4, 8, dtype=torch.float64).to(torch.bfloat16)
    want = x.double() / (x.double().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    torch.testing.assert_close(single(x, object()).double(), want, rtol=1e-6, atol=1e-6)


def test_moe_refuses_a_score_function_it_does_not_know() -> None:
    cfg = integ.Magi2MultiHeadMoEConfig(64, 4, 8, 2, 32, torch.float32, score_func="relu")
    with pytest.raises(m2.InvalidValueError, match="softmax"):
        integ.Magi2MultiHeadMoE(cfg, ep_group=integ.EPGroup())


# ---------------------------------------------------------------------------------------------
# on a GPU: the fused providers behind the layers, CUDA graphs
# ---------------------------------------------------------------------------------------------
gpu = pytest.mark.gpu


@gpu
@torch.no_grad()
def test_gpu_moe_layer_prepared_and_graphed_equals_bare_ops() -> None:
    cfg = integ.Magi2MultiHeadMoEConfig(3 * 256, 3, 256, 6, 1280, torch.bfloat16, route_scale=4.9)
    layer = integ.Magi2MultiHeadMoE(cfg, ep_group=integ.EPGroup(), device="cuda")
    state = {n: (torch.randn(t.shape, device="cuda") * 0.05).to(t.dtype) for n, t in layer.state_dict().items()}
    layer.load_state_dict(state)
    weights = layer.prepared_weights()
    if weights.layout != "checkpoint":  # a packing provider: the parameters are views of its storage
        assert layer.W_gate.untyped_storage().data_ptr() == layer.W_up.untyped_storage().data_ptr()
    assert all(torch.equal(layer.state_dict()[n], state[n]) for n in state)
    x = torch.randn(4096, 3 * 256, device="cuda").bfloat16()
    heads = x.view(-1, 3, 256)
    probs, idx = m2.moe_route(heads, layer.gate, layer.router.expert_bias_ema, top_k=6, route_scale=4.9)
    want = m2.moe_experts(heads, probs, idx, weights).view_as(x)
    eager = layer(x)
    assert torch.equal(eager, want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layer(x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, want)


@gpu
def test_gpu_varlen_attention_with_device_prefix_sums() -> None:
    import oracles

    lens = [300, 1, 700, 64]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    t = int(cu[-1])
    q, k, v = (torch.randn(t, 8, 128, dtype=torch.float64).to(torch.bfloat16) for _ in range(3))
    sink = torch.randn(1, 8)
    got = integ.varlen_attention_with_sink(
        q.cuda(),
        k.cuda(),
        v.cuda(),
        cu_seqlens_q=cu.cuda(),
        cu_seqlens_k=cu.cuda(),
        max_seqlen_q=max(lens),
        max_seqlen_k=max(lens),
        sink=sink.cuda(),
    )
    want = oracles.attention(q, k, v, cu, cu, sinks=sink).o
    torch.testing.assert_close(got.cpu().double(), want, rtol=1.6e-2, atol=1e-2)
