"""The vllm-omni integration against stand-ins of vllm-omni 0.30.0 (CI cannot install vLLM).

Stand-ins (``tests/integrations/vllm_omni_standin/``), each mirroring vllm-omni 0.30.0 at the same
module path: names, parameter names/shapes/dtypes and call signatures read from upstream; bodies
written for these tests:

====================================================  =====================================================
stand-in module                                       mirrors (vllm-omni 0.30.0, ``vllm_omni/...``)
====================================================  =====================================================
``diffusion/models/magi2/configuration_magi2.py``     ``configuration_magi2.py``: the architecture dims
``diffusion/models/magi2/parallel.py``                ``parallel.py``: ``Magi2ParallelGroup``, group getters (one rank)
``diffusion/models/magi2/layers.py``                  ``layers.py``: ``ModalityDispatcher``, ``MultiModalityRMSNorm``
``diffusion/models/magi2/mh_moe.py``                  ``mh_moe.py``: ``Magi2MultiHeadMoEConfig``, ``Magi2MultiHeadMoE`` (torch path)
``diffusion/models/magi2/attention.py``               ``attention.py``: ``VarlenHandler``, the kernel -> Ulysses -> packed chain (torch path)
``diffusion/models/magi2/modeling_magi2.py``          ``modeling_magi2.py``: import-time name binding, module tree, ``load_weights``
``diffusion/attention/backends/abstract.py``          ``attention/backends/abstract.py``: ``AttentionMetadata.extra``
====================================================  =====================================================
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import magi2_core as m2
from magi2_core.errors import ConfigError
from magi2_core.integrations import vllm_omni as integ
from magi2_core.integrations.vllm_omni import plugin

STANDIN = Path(__file__).parent / "vllm_omni_standin"
PKG = "vllm_omni.diffusion.models.magi2"
LOGGER = "magi2_core.integrations.vllm_omni.plugin"

Standin = Callable[..., ModuleType]


def _drop_vllm_omni_modules() -> None:
    for name in [n for n in sys.modules if n == "vllm_omni" or n.startswith("vllm_omni.")]:
        del sys.modules[name]


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """``standin(version)`` puts the stand-in vllm-omni (with that distribution version) on sys.path.

    Everything is undone afterwards: the path, the imported modules, the plugin's import hook and
    patches, the configuration.
    """

    def install(version: str | None = "0.30.0") -> None:
        if version is not None:
            info = tmp_path / f"vllm_omni-{version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-omni\nVersion: {version}\n")
            monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.syspath_prepend(str(STANDIN))
        importlib.invalidate_caches()

    _drop_vllm_omni_modules()
    yield install
    integ.unregister()
    _drop_vllm_omni_modules()
    monkeypatch.undo()
    importlib.invalidate_caches()
    m2.reload_config()


def _modeling() -> ModuleType:
    return importlib.import_module(f"{PKG}.modeling_magi2")


def _swapped(modeling: ModuleType) -> dict[str, bool]:
    attention = sys.modules[f"{PKG}.attention"]
    return {
        "attention": attention.packed_attention_with_sink is integ.packed_attention_with_sink,
        "moe": modeling.Magi2MultiHeadMoE is integ.Magi2MultiHeadMoE,
        "rmsnorm": modeling.MultiModalityRMSNorm is integ.MultiModalityRMSNorm,
    }


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("magi2_core")]


# ---------------------------------------------------------------------------------------------
# the plugin
# ---------------------------------------------------------------------------------------------
def test_absent_vllm_omni_is_silent(standin: Callable[..., None], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="magi2_core")
    assert importlib.util.find_spec("vllm_omni") is None  # CI has no vllm-omni; the stand-in is not on the path
    integ.register()
    assert _records(caplog) == []
    assert not any(isinstance(f, plugin._PatchOnImport) for f in sys.meta_path)


@pytest.mark.parametrize("import_first", [False, True], ids=["hook", "already-imported"])
def test_plugin_swaps_the_three_operators(
    standin: Callable[..., None], caplog: pytest.LogCaptureFixture, import_first: bool
) -> None:
    standin("0.30.0")
    caplog.set_level(logging.INFO, logger="magi2_core")
    if import_first:
        modeling = _modeling()
        assert not any(_swapped(modeling).values())
        integ.register()
    else:
        integ.register()
        assert f"{PKG}.modeling_magi2" not in sys.modules  # nothing imported at plugin load
        modeling = _modeling()
    assert _swapped(modeling) == {"attention": True, "moe": True, "rmsnorm": True}
    info = [r.getMessage() for r in _records(caplog) if r.levelno == logging.INFO]
    assert len(info) == 3, info
    for op, text in zip(("attention", "moe", "rmsnorm"), info, strict=True):
        assert f"MAGI-2 {op} " in text and "resolves" in text and "'reference'" in text, text
    # a model built now is made of magi2-core's layers
    model = modeling.Magi2PreviewTransformer(_small_config(modeling))
    kinds = {type(m) for m in model.modules()}
    assert integ.Magi2MultiHeadMoE in kinds and integ.MultiModalityRMSNorm in kinds
    assert sys.modules[f"{PKG}.layers"].MultiModalityRMSNorm not in kinds


def test_register_is_idempotent(standin: Callable[..., None], caplog: pytest.LogCaptureFixture) -> None:
    standin("0.30.0")
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    integ.register()
    assert sum(isinstance(f, plugin._PatchOnImport) for f in sys.meta_path) == 1
    modeling = _modeling()
    integ.register()
    assert all(_swapped(modeling).values())
    assert len([r for r in _records(caplog) if r.levelno == logging.INFO]) == 3
    integ.unregister()
    assert not any(_swapped(modeling).values())
    assert modeling.Magi2MultiHeadMoE is sys.modules[f"{PKG}.mh_moe"].Magi2MultiHeadMoE


@pytest.mark.parametrize("version", ["0.31.0", "0.29.2", "1.0.0"])
def test_other_vllm_omni_version_logs_and_does_nothing(
    standin: Callable[..., None], caplog: pytest.LogCaptureFixture, version: str
) -> None:
    standin(version)
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    modeling = _modeling()
    assert not any(_swapped(modeling).values())
    (record,) = _records(caplog)
    assert record.levelno == logging.WARNING
    assert f"vllm-omni {version} is installed" in record.getMessage() and "0.31" in record.getMessage()


def test_patch_release_of_the_supported_minor_is_accepted(standin: Callable[..., None]) -> None:
    standin("0.30.2")
    integ.register()
    assert all(_swapped(_modeling()).values())


def test_opt_out_logs_and_does_nothing(
    standin: Callable[..., None], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin("0.30.0")
    monkeypatch.setenv("MAGI2_VLLM_OMNI", "0")
    m2.reload_config()
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    modeling = _modeling()
    assert not any(_swapped(modeling).values())
    (record,) = _records(caplog)
    assert record.levelno == logging.INFO and "MAGI2_VLLM_OMNI=0" in record.getMessage()


def test_no_distribution_metadata_logs_and_does_nothing(
    standin: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    standin(None)  # importable, but no installed distribution says which version it is
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    assert not any(_swapped(_modeling()).values())
    (record,) = _records(caplog)
    assert record.levelno == logging.WARNING and "cannot be checked" in record.getMessage()


def test_an_attribute_replaced_by_someone_else_is_left_alone(
    standin: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    standin("0.30.0")
    modeling = _modeling()

    class TheirNorm(torch.nn.Module):
        pass

    modeling.MultiModalityRMSNorm = TheirNorm
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    assert _swapped(modeling) == {"attention": True, "moe": True, "rmsnorm": False}
    assert modeling.MultiModalityRMSNorm is TheirNorm
    warnings = [r.getMessage() for r in _records(caplog) if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "rmsnorm left as it is" in warnings[0] and "TheirNorm" in warnings[0]


def test_a_changed_call_signature_is_left_alone(standin: Callable[..., None], caplog: pytest.LogCaptureFixture) -> None:
    standin("0.30.0")
    modeling = _modeling()
    attention = sys.modules[f"{PKG}.attention"]

    def packed_attention_with_sink(
        q: Any, k: Any, v: Any, varlen: Any, *, softcap: float = -1.0, sink: Any = None, window: int = 0
    ) -> Any:
        raise AssertionError("not called")

    attention.packed_attention_with_sink = packed_attention_with_sink  # as if vllm-omni 0.30.x had changed it
    caplog.set_level(logging.INFO, logger="magi2_core")
    integ.register()
    assert _swapped(modeling) == {"attention": False, "moe": True, "rmsnorm": True}
    (warning,) = [r.getMessage() for r in _records(caplog) if r.levelno == logging.WARNING]
    assert "window" in warning and "signature" in warning


def test_plugin_is_installed_as_a_vllm_general_plugin() -> None:
    found = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert [ep.value for ep in found if ep.dist is not None and ep.dist.name == "magi2-core"] == [
        "magi2_core.integrations.vllm_omni:register"
    ]


# ---------------------------------------------------------------------------------------------
# the layers: checkpoint names and shapes, numerics against the stand-in's torch math
# ---------------------------------------------------------------------------------------------
def _small_config(modeling: ModuleType, params_dtype: torch.dtype = torch.float32) -> Any:
    """vllm-omni's config class with small dims (the names, and so the checkpoint names, are the release's)."""
    cfg = sys.modules[f"{PKG}.configuration_magi2"]
    return cfg.Magi2PreviewConfig(
        num_layers=4,
        hidden_size=64,
        head_dim=16,
        num_query_groups=4,
        multimodal_layers=(0, 3),
        params_dtype=params_dtype,
        mhc=cfg.Magi2MHCConfig(num_streams=2),
        moe=cfg.Magi2MoEConfig(num_heads=4, num_experts=8, top_k=2, expert_intermediate_size=32, layers=(1, 2)),
    )


def _checkpoint_shapes(cfg: Any) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) of every checkpoint tensor owned by the three swapped layers, derived
    from vllm-omni 0.30.0's configuration the way its modeling_magi2 sizes them."""
    f32, hidden, moe = torch.float32, cfg.hidden_size, cfg.moe
    out = {f"post_adapter.final_norm_{m}.weight": ((cfg.virtual_width,), f32) for m in ("video", "audio")}
    for i in range(cfg.num_layers):
        mods = 3 if i in cfg.multimodal_layers else 1
        p = f"block.layers.{i}."
        out[p + "attention.pre_norm.weight"] = ((mods * hidden,), f32)
        out[p + "attention.sinks"] = ((cfg.attention_sink_tokens, cfg.num_heads_q), f32)
        out[p + "attention.q_norm.weight"] = ((mods * cfg.head_dim,), f32)
        out[p + "attention.k_norm.weight"] = ((mods * cfg.head_dim,), f32)
        out[p + "mhc_norm.weight"] = ((mods * cfg.virtual_width,), f32)
        if i not in moe.layers:
            out[p + "mlp.pre_norm.weight"] = ((mods * hidden,), f32)
            continue
        rows, d, inter = moe.num_heads * moe.num_experts, hidden // moe.num_heads, moe.expert_intermediate_size
        out[p + "mlp.pre_norm.weight"] = ((3 * hidden,), f32)
        out[p + "mlp.moe_mlp.gate"] = ((rows, d), f32)
        out[p + "mlp.moe_mlp.W_gate"] = ((rows, d, inter), cfg.params_dtype)
        out[p + "mlp.moe_mlp.W_up"] = ((rows, d, inter), cfg.params_dtype)
        out[p + "mlp.moe_mlp.W_down"] = ((rows, inter, d), cfg.params_dtype)
        out[p + "mlp.moe_mlp.router.expert_bias"] = ((rows,), f32)
        out[p + "mlp.moe_mlp.router.expert_bias_ema"] = ((rows,), f32)
    return out


def _random_checkpoint(cfg: Any) -> dict[str, torch.Tensor]:
    ckpt = {}
    for name, (shape, dtype) in _checkpoint_shapes(cfg).items():
        scale = 0.3 if name.endswith(("W_gate", "W_up", "W_down", ".gate")) else 0.2
        ckpt[name] = (torch.randn(shape, dtype=torch.float64) * scale).to(dtype)
    return ckpt


def _layout(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    return {n: (tuple(t.shape), t.dtype) for n, t in model.state_dict().items()}


def test_release_config_checkpoint_layout(standin: Callable[..., None]) -> None:
    """The release's dims (12 heads x 256 experts, d 3072, 40 layers), built on the meta device."""
    standin("0.30.0")
    modeling = _modeling()
    with torch.device("meta"):
        upstream = modeling.Magi2PreviewTransformer()
    integ.register()
    with torch.device("meta"):
        ours = modeling.Magi2PreviewTransformer()
    assert isinstance(ours.block.layers[2].mlp.moe_mlp, integ.Magi2MultiHeadMoE)
    expected = _checkpoint_shapes(ours.config)
    assert _layout(upstream) == expected
    assert _layout(ours) == expected
    assert expected["block.layers.2.mlp.moe_mlp.W_gate"] == ((12 * 256, 256, 1280), torch.bfloat16)


@pytest.mark.parametrize("params_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_checkpoint_loads_without_renaming_and_round_trips(
    standin: Callable[..., None], params_dtype: torch.dtype
) -> None:
    standin("0.30.0")
    integ.register()
    modeling = _modeling()
    cfg = _small_config(modeling, params_dtype)
    ckpt = _random_checkpoint(cfg)

    model = modeling.Magi2PreviewTransformer(cfg)
    model.load_state_dict(ckpt, strict=True)
    back = model.state_dict()
    assert back.keys() == ckpt.keys()
    for name, tensor in ckpt.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name

    # vllm-omni's own loader: "transformer." prefix, ep_slice, the EMA bias copied into expert_bias
    again = modeling.Magi2PreviewTransformer(cfg)
    loaded = again.load_weights((f"transformer.{n}", t) for n, t in ckpt.items())
    assert loaded == set(ckpt)
    for name, tensor in again.state_dict().items():
        source = name.replace("expert_bias", "expert_bias_ema") if name.endswith("router.expert_bias") else name
        assert torch.equal(tensor, ckpt[source]), name


def _layer_step(layer: torch.nn.Module, cfg: Any, x: torch.Tensor, dispatcher: Any, varlen: Any) -> torch.Tensor:
    """One layer's swapped operators in the model's order: norm -> q/k norms -> packed attention
    with the layer's sink -> norm -> MoE (MoE layers) -> mHC norm, joined by residual adds."""
    metadata = importlib.import_module("vllm_omni.diffusion.attention.backends.abstract").AttentionMetadata
    t, act, att = x.shape[0], x.dtype, layer.attention
    h = att.pre_norm(x, dispatcher)
    q = att.q_norm(h.view(t, cfg.num_heads_q, cfg.head_dim), dispatcher).to(act)
    k = att.k_norm(h.view(t, cfg.num_heads_kv, cfg.head_dim), dispatcher).to(act)
    v = h.view(t, cfg.num_heads_kv, cfg.head_dim)
    extra = {"magi2_varlen": varlen, "magi2_split_sizes": [t], "magi2_sink": att.sinks}
    x = x + att.packed_attention(q, k, v, metadata(extra=extra)).reshape(t, -1)
    m = layer.mlp.pre_norm(x, dispatcher)
    if hasattr(layer.mlp, "moe_mlp"):
        x = x + layer.mlp.moe_mlp(m)
    return x + layer.mhc_norm(x.repeat(1, cfg.mhc.num_streams), dispatcher)[:, : cfg.hidden_size].to(act)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 2e-6), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
@torch.no_grad()
def test_swapped_stack_matches_the_standins_torch_math(
    standin: Callable[..., None], dtype: torch.dtype, tol: float
) -> None:
    """Each layer of the swapped model gets the stand-in model's input to that layer (so a BF16
    rounding difference cannot flip a later route) and must give the stand-in's output."""
    standin("0.30.0")
    modeling = _modeling()
    layers = sys.modules[f"{PKG}.layers"]
    attention = sys.modules[f"{PKG}.attention"]
    cfg = _small_config(modeling, dtype)
    ckpt = _random_checkpoint(cfg)
    upstream = modeling.Magi2PreviewTransformer(cfg)
    upstream.load_state_dict(ckpt, strict=True)
    integ.register()
    ours = modeling.Magi2PreviewTransformer(cfg)
    ours.load_state_dict(ckpt, strict=True)

    t = 29
    dispatcher = layers.ModalityDispatcher(torch.randint(0, 3, (t,)), 3)
    assert min(dispatcher.group_size_cpu) > 0
    cu = torch.tensor([0, 7, 8, 20, t], dtype=torch.int32)
    for varlen in (attention.VarlenHandler(cu, cu), attention.VarlenHandler(cu, cu, 12, 12)):
        x = torch.randn(t, cfg.hidden_size, dtype=torch.float64).to(dtype)
        for i, (theirs, mine) in enumerate(zip(upstream.block.layers, ours.block.layers, strict=True)):
            want, got = _layer_step(theirs, cfg, x, dispatcher, varlen), _layer_step(mine, cfg, x, dispatcher, varlen)
            assert got.dtype == want.dtype and got.shape == want.shape, i
            err = float((got.double() - want.double()).norm() / (want.double() - x.double()).norm())
            assert err < tol, f"layer {i}: relative error of the layer's update {err:.2e} (tolerance {tol:.0e})"
            x = want
        final = [m.post_adapter.final_norm_video(x.repeat(1, cfg.mhc.num_streams)) for m in (upstream, ours)]
        torch.testing.assert_close(final[1], final[0], rtol=1e-6 if dtype == torch.float32 else 8e-3, atol=1e-6)


def _single_moe(modeling: ModuleType, cls: type, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    cfg = _small_config(modeling, dtype)
    moe = cfg.moe
    config = sys.modules[f"{PKG}.mh_moe"].Magi2MultiHeadMoEConfig(
        hidden_size=cfg.hidden_size,
        num_heads=moe.num_heads,
        num_experts=moe.num_experts,
        top_k=moe.top_k,
        expert_intermediate_size=moe.expert_intermediate_size,
        params_dtype=dtype,
        route_scale=moe.routing_scale,
    )
    return cls(config)


@pytest.mark.parametrize(("ema", "main"), [("ema", "main"), ("EMA", " Main ")])
def test_router_bias_source_selects_the_bias_as_upstream(
    standin: Callable[..., None], monkeypatch: pytest.MonkeyPatch, ema: str, main: str
) -> None:
    standin("0.30.0")
    modeling = _modeling()
    upstream = _single_moe(modeling, sys.modules[f"{PKG}.mh_moe"].Magi2MultiHeadMoE)
    ours = _single_moe(modeling, integ.Magi2MultiHeadMoE)
    state = {n: torch.randn(t.shape, dtype=torch.float64).to(t.dtype) * 0.3 for n, t in upstream.state_dict().items()}
    state["router.expert_bias"] = torch.randn(state["router.expert_bias"].shape) * 3  # decides the selection
    upstream.load_state_dict(state)
    ours.load_state_dict(state)
    x = torch.randn(33, 64)
    outputs = {}
    with torch.no_grad():
        for spelled in (ema, main):
            monkeypatch.setenv("MAGI2_ROUTER_BIAS_SOURCE", spelled)
            m2.reload_config()
            want = upstream(x)
            torch.testing.assert_close(ours(x), want, rtol=2e-5, atol=2e-5)
            outputs[spelled] = want
    assert not torch.allclose(outputs[ema], outputs[main])  # the two biases do select differently


def test_bad_router_bias_source_names_the_accepted_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGI2_ROUTER_BIAS_SOURCE", "average")  # vllm-omni would silently take "ema"
    try:
        with pytest.raises(ConfigError, match="MAGI2_ROUTER_BIAS_SOURCE") as info:
            m2.reload_config()
        assert "ema | main" in str(info.value)
    finally:
        monkeypatch.delenv("MAGI2_ROUTER_BIAS_SOURCE")
        m2.reload_config()


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


@pytest.mark.parametrize(("score_func", "route_norm"), [("softmax", True), ("sigmoid", False), ("softmax", False)])
@torch.no_grad()
def test_moe_routing_options_match_the_standin(standin: Callable[..., None], score_func: str, route_norm: bool) -> None:
    """vllm-omni's MoE config allows softmax scores and unnormalised weights (the release uses neither)."""
    standin("0.30.0")
    mh_moe = importlib.import_module(f"{PKG}.mh_moe")
    cfg = mh_moe.Magi2MultiHeadMoEConfig(64, 4, 8, 2, 32, torch.float32, score_func, route_norm, route_scale=2.5)
    upstream, ours = mh_moe.Magi2MultiHeadMoE(cfg), integ.Magi2MultiHeadMoE(cfg)
    state = {n: torch.randn(t.shape, dtype=torch.float64).to(t.dtype) * 0.3 for n, t in upstream.state_dict().items()}
    upstream.load_state_dict(state)
    ours.load_state_dict(state)
    x = torch.randn(33, 64)
    torch.testing.assert_close(ours(x), upstream(x), rtol=2e-5, atol=2e-5)


# ---------------------------------------------------------------------------------------------
# weight preparation: the parameters live on the prepared storage
# ---------------------------------------------------------------------------------------------
class _InterleavingPreparer:
    """``prepare_moe_weights`` as a packing provider does it (the ``w13_interleaved`` layout), with
    the exact CPU reference left to compute: the layer's bookkeeping is under test, not a kernel."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> m2.PreparedMoEWeights:
        self.calls += 1
        f, d, i = w_gate.shape
        w13 = torch.stack((w_gate.detach().transpose(1, 2), w_up.detach().transpose(1, 2)), dim=2).reshape(f, 2 * i, d)
        return m2.PreparedMoEWeights.from_layout("reference", "w13_interleaved", (w13.contiguous(), w_down.detach()))


def _plain_output(state: dict[str, torch.Tensor], x: torch.Tensor, group: integ.EPGroup) -> torch.Tensor:
    layer = integ.Magi2MultiHeadMoE(_MOE_CFG, ep_group=group)
    layer.load_state_dict(state)
    return layer(x)


_MOE_CFG = integ.Magi2MultiHeadMoEConfig(48, 3, 8, 2, 24, torch.bfloat16, route_scale=4.9)


@torch.no_grad()
def test_moe_parameters_are_views_of_the_prepared_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    single = integ.EPGroup()
    state = {
        n: (torch.randn(t.shape, dtype=torch.float64) * 0.4).to(t.dtype)
        for n, t in integ.Magi2MultiHeadMoE(_MOE_CFG, ep_group=single).state_dict().items()
    }
    x = torch.randn(21, 48, dtype=torch.float64).bfloat16()
    want = _plain_output(state, x, single)

    preparer = _InterleavingPreparer()
    monkeypatch.setattr(integ.moe.ops, "prepare_moe_weights", preparer)
    layer = integ.Magi2MultiHeadMoE(_MOE_CFG, ep_group=single)
    layer.load_state_dict(state)
    assert preparer.calls == 2  # at construction and after the load
    # one storage holds gate and up: no second copy
    assert layer.W_gate.untyped_storage().data_ptr() == layer.W_up.untyped_storage().data_ptr()
    assert not layer.W_gate.is_contiguous()
    assert torch.equal(layer(x), want)
    saved = layer.state_dict()
    assert all(saved[n].is_contiguous() and torch.equal(saved[n], state[n]) for n in state)

    # vllm-omni's loader copies in place: the prepared layout is filled directly, nothing re-packs
    prepared = layer._prepared
    new_up = (torch.randn(state["W_up"].shape, dtype=torch.float64) * 0.4).bfloat16()
    layer.W_up.copy_(new_up)
    got = layer(x)
    assert layer._prepared is prepared
    assert torch.equal(got, _plain_output({**state, "W_up": new_up}, x, single))
    # a loader that re-seats a parameter is noticed by the next forward
    new_down = (torch.randn(state["W_down"].shape, dtype=torch.float64) * 0.4).bfloat16()
    layer.W_down.data = new_down.clone()
    got = layer(x)
    assert layer._prepared is not prepared
    assert torch.equal(got, _plain_output({**state, "W_up": new_up, "W_down": new_down}, x, single))
    # a dtype move prepares again, onto one storage again
    calls = preparer.calls
    layer.to(torch.float32)
    assert preparer.calls == calls + 1 and layer.W_gate.dtype == torch.float32
    assert layer.W_gate.untyped_storage().data_ptr() == layer.W_up.untyped_storage().data_ptr()


@torch.no_grad()
def test_moe_phantom_heads_use_only_the_real_rows_of_the_prepared_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    """3 heads on 2 ranks, tensor-parallel layout (no exchange): rank 1 owns head 2 and a phantom head."""
    full = {
        n: (torch.randn(t.shape, dtype=torch.float64) * 0.4).to(t.dtype)
        for n, t in integ.Magi2MultiHeadMoE(_MOE_CFG, ep_group=integ.EPGroup()).state_dict().items()
    }
    x = torch.randn(16, 48, dtype=torch.float64).bfloat16()
    want = _plain_output(full, x, integ.EPGroup())[:, 32:48]

    monkeypatch.setattr(integ.moe.ops, "prepare_moe_weights", _InterleavingPreparer())
    rank1 = integ.Magi2MultiHeadMoE(_MOE_CFG, ep_group=integ.EPGroup(None, 2, 1, replicated_sequence=True))
    rank1.load_state_dict({n: rank1.ep_slice(t) for n, t in full.items()})
    assert rank1.real_local_heads == 1 and rank1.local_num_heads == 2
    local = torch.cat((x[:, 32:48], torch.zeros(16, 16, dtype=torch.bfloat16)), dim=1)
    y = rank1(local)
    assert torch.equal(y[:, :16], want) and not y[:, 16:].any()


def test_plugin_lines_reach_vllms_log_handlers(standin: Callable[..., None], monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM configures only its own logger; the plugin lends its handlers to ``magi2_core`` when
    nothing else would print the INFO lines."""
    standin("0.30.0")
    ours, vllm_logger = logging.getLogger("magi2_core"), logging.getLogger("vllm")
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    monkeypatch.setattr(ours, "propagate", False)  # as if no handler were configured above us
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    monkeypatch.setattr(vllm_logger, "handlers", [handler])
    integ.register()
    _modeling()
    assert ours.handlers == [handler] and ours.level == logging.INFO
    assert len([line for line in lines if "now runs on magi2-core" in line]) == 3


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


@torch.no_grad()
def test_vllm_omni_loader_fills_the_prepared_layout_in_place(
    standin: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """vllm-omni's load_weights copies into ``state_dict(keep_vars=True)`` entries: with a packing
    provider those are strided views of the prepared storage, and the copy must land there."""
    standin("0.30.0")
    integ.register()
    modeling = _modeling()
    cfg = _small_config(modeling, torch.bfloat16)
    ckpt = _random_checkpoint(cfg)
    plain = modeling.Magi2PreviewTransformer(cfg)
    plain.load_state_dict(ckpt, strict=True)
    monkeypatch.setattr(integ.moe.ops, "prepare_moe_weights", _InterleavingPreparer())
    model = modeling.Magi2PreviewTransformer(cfg)
    moe = model.block.layers[1].mlp.moe_mlp
    bank = moe.W_gate.untyped_storage().data_ptr()
    assert not moe.W_gate.is_contiguous() and moe.W_up.untyped_storage().data_ptr() == bank
    model.load_weights((f"transformer.{n}", t) for n, t in ckpt.items())
    assert moe.W_gate.untyped_storage().data_ptr() == bank  # filled in place, nothing re-seated
    for name, tensor in model.state_dict().items():
        source = name.replace("expert_bias", "expert_bias_ema") if name.endswith("router.expert_bias") else name
        assert torch.equal(tensor, ckpt[source]), name
    x = torch.randn(19, cfg.hidden_size, dtype=torch.float64).bfloat16()
    assert torch.equal(moe(x), plain.block.layers[1].mlp.moe_mlp(x))
