"""The MoE layer's prepared weights, in place, and under vllm-omni 0.30.0's own layer-wise offloader.

A packing provider (the Triton MoE's ``w13_interleaved`` bank) is stood in for on the CPU by
``_InterleavingPreparer``: the layer's bookkeeping is under test, not a kernel. The CPU keeps the
checkpoint layout (:data:`~magi2_core.integrations.vllm_omni.moe.HOST_DEVICE_TYPES`), so a test that
needs the layer to pack on the CPU, as it would on a GPU, empties that set.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

import magi2_core as m2
from magi2_core.integrations import vllm_omni as integ

PKG = "vllm_omni.diffusion.models.magi2"
_MOE_CFG = integ.Magi2MultiHeadMoEConfig(48, 3, 8, 2, 24, torch.bfloat16, route_scale=4.9)


class _InterleavingPreparer:
    """``prepare_moe_weights`` as a packing provider does it (the ``w13_interleaved`` layout), with
    the exact CPU reference left to compute."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor) -> m2.PreparedMoEWeights:
        self.calls += 1
        f, d, i = w_gate.shape
        w13 = torch.stack((w_gate.detach().transpose(1, 2), w_up.detach().transpose(1, 2)), dim=2).reshape(f, 2 * i, d)
        return m2.PreparedMoEWeights.from_layout("reference", "w13_interleaved", (w13.contiguous(), w_down.detach()))


@pytest.fixture
def packing(monkeypatch: pytest.MonkeyPatch) -> _InterleavingPreparer:
    """The layer packs on the CPU, as it does on a GPU with the Triton provider."""
    preparer = _InterleavingPreparer()
    monkeypatch.setattr(integ.moe.ops, "prepare_moe_weights", preparer)
    monkeypatch.setattr(integ.moe, "HOST_DEVICE_TYPES", frozenset())
    return preparer


def _state(cfg: Any = _MOE_CFG) -> dict[str, torch.Tensor]:
    layer = integ.Magi2MultiHeadMoE(cfg, ep_group=integ.EPGroup(), device="meta")  # names, shapes, dtypes
    return {n: (torch.randn(t.shape, dtype=torch.float64) * 0.4).to(t.dtype) for n, t in layer.state_dict().items()}


def _plain_output(state: dict[str, torch.Tensor], x: torch.Tensor, group: integ.EPGroup) -> torch.Tensor:
    layer = integ.Magi2MultiHeadMoE(_MOE_CFG, ep_group=group)
    layer.load_state_dict(state)
    return layer(x)


def _bank(layer: integ.Magi2MultiHeadMoE) -> int:
    return layer.W_gate.untyped_storage().data_ptr()


# ---------------------------------------------------------------------------------------------
# the parameters live on the prepared storage, and nothing else holds it
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def test_host_weights_keep_the_checkpoint_layout_and_resolve_no_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU (a host copy under layer-wise offloading) nothing is packed and no provider is
    resolved, so a provider forced for the GPU does not stop a model from being built there."""
    preparer = _InterleavingPreparer()
    monkeypatch.setattr(integ.moe.ops, "prepare_moe_weights", preparer)
    monkeypatch.setenv("MAGI2_MOE_PROVIDER", "triton")
    m2.reload_config()
    try:
        layer = integ.Magi2MultiHeadMoE(_MOE_CFG, ep_group=integ.EPGroup())
        layer.load_state_dict(_state())
        weights = layer.prepared_weights()
    finally:
        monkeypatch.delenv("MAGI2_MOE_PROVIDER")
        m2.reload_config()
    assert preparer.calls == 0 and weights.layout == "checkpoint"
    assert layer.W_gate.is_contiguous() and _bank(layer) != layer.W_up.untyped_storage().data_ptr()


@torch.no_grad()
def test_moe_parameters_are_views_of_the_prepared_layout(packing: _InterleavingPreparer) -> None:
    single = integ.EPGroup()
    state = _state()
    x = torch.randn(21, 48, dtype=torch.float64).bfloat16()
    with pytest.MonkeyPatch.context() as plain:
        plain.setattr(integ.moe, "HOST_DEVICE_TYPES", frozenset({"cpu"}))
        want = _plain_output(state, x, single)

    layer = integ.Magi2MultiHeadMoE(_MOE_CFG, ep_group=single)
    layer.load_state_dict(state)
    assert packing.calls == 1  # at construction; the load copied into the prepared views in place
    assert _bank(layer) == layer.W_up.untyped_storage().data_ptr()  # one storage holds gate and up
    assert not layer.W_gate.is_contiguous()
    assert torch.equal(layer(x), want)
    saved = layer.state_dict()
    assert all(saved[n].is_contiguous() and torch.equal(saved[n], state[n]) for n in state)

    # vllm-omni's loader copies in place: the prepared layout is filled directly, nothing re-packs
    new_up = (torch.randn(state["W_up"].shape, dtype=torch.float64) * 0.4).bfloat16()
    layer.W_up.copy_(new_up)
    got = layer(x)
    assert packing.calls == 1
    with pytest.MonkeyPatch.context() as plain:
        plain.setattr(integ.moe, "HOST_DEVICE_TYPES", frozenset({"cpu"}))
        assert torch.equal(got, _plain_output({**state, "W_up": new_up}, x, single))
        # a loader that re-seats a parameter is noticed by the next forward
        new_down = (torch.randn(state["W_down"].shape, dtype=torch.float64) * 0.4).bfloat16()
        want = _plain_output({**state, "W_up": new_up, "W_down": new_down}, x, single)
    layer.W_down.data = new_down.clone()
    assert torch.equal(layer(x), want) and packing.calls == 2
    # a dtype move prepares again, onto one storage again; a move to where it is changes nothing
    layer.to(torch.float32)
    assert packing.calls == 3 and layer.W_gate.dtype == torch.float32
    assert _bank(layer) == layer.W_up.untyped_storage().data_ptr()
    layer.to(torch.float32)
    assert packing.calls == 3


@torch.no_grad()
def test_freeing_the_parameters_frees_the_prepared_bank(packing: _InterleavingPreparer) -> None:
    """What an offloader does after a layer ran (each parameter re-seated on an empty placeholder)
    must free the whole prepared bank: the layer keeps its geometry, not its tensors."""
    layer = integ.Magi2MultiHeadMoE(_MOE_CFG, ep_group=integ.EPGroup())
    layer.load_state_dict(_state())
    layer(torch.randn(9, 48).bfloat16())
    weights = layer.prepared_weights()
    assert weights.layout == "w13_interleaved" and weights.nbytes == 3 * layer.W_down.numel() * 2
    storages = [StorageWeakRef(t.untyped_storage()) for t in weights.tensors]
    del weights
    for p in (layer.W_gate, layer.W_up, layer.W_down):
        p.data = torch.empty(0, dtype=p.dtype)
    assert all(s.expired() for s in storages)


@torch.no_grad()
def test_moe_phantom_heads_use_only_the_real_rows_of_the_prepared_layout(packing: _InterleavingPreparer) -> None:
    """3 heads on 2 ranks, tensor-parallel layout (no exchange): rank 1 owns head 2 and a phantom head."""
    full = _state()
    x = torch.randn(16, 48, dtype=torch.float64).bfloat16()
    with pytest.MonkeyPatch.context() as plain:
        plain.setattr(integ.moe, "HOST_DEVICE_TYPES", frozenset({"cpu"}))
        want = _plain_output(full, x, integ.EPGroup())[:, 32:48]
    rank1 = integ.Magi2MultiHeadMoE(_MOE_CFG, ep_group=integ.EPGroup(None, 2, 1, replicated_sequence=True))
    rank1.load_state_dict({n: rank1.ep_slice(t) for n, t in full.items()})
    assert rank1.real_local_heads == 1 and rank1.local_num_heads == 2
    weights = rank1.prepared_weights()
    assert all(t.shape[0] == 8 for t in weights.tensors)  # the real head's 8 rows only
    local = torch.cat((x[:, 32:48], torch.zeros(16, 16, dtype=torch.bfloat16)), dim=1)
    y = rank1(local)
    assert torch.equal(y[:, :16], want) and not y[:, 16:].any()


# ---------------------------------------------------------------------------------------------
# vllm-omni's own model code: load_weights, the layer-wise offloader
# ---------------------------------------------------------------------------------------------
def _mod(name: str) -> Any:
    return importlib.import_module(name if name.startswith("vllm_omni") else f"{PKG}.{name}")


def _config(dtype: torch.dtype = torch.bfloat16) -> Any:
    cfg = _mod("configuration_magi2")
    return cfg.Magi2PreviewConfig(
        num_layers=4,
        hidden_size=48,
        head_dim=16,
        num_query_groups=3,
        video_in_channels=4,
        audio_in_channels=4,
        text_in_channels=4,
        intermediate_factor=1.0,
        multimodal_layers=(0,),
        params_dtype=dtype,
        mhc=cfg.Magi2MHCConfig(num_streams=2),
        moe=cfg.Magi2MoEConfig(
            num_heads=3,
            num_experts=8,
            top_k=2,
            expert_intermediate_size=24,
            shared_expert_intermediate_size=16,
            modality_shared_expert_intermediate_size=16,
            layers=(1, 2, 3),
        ),
    )


def _checkpoint(model: nn.Module, seed: int = 2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        n: t.clone() if n.endswith(".bands") else (torch.randn(t.shape, generator=g) * 0.1).to(t.dtype)
        for n, t in model.state_dict().items()
    }


def _model(cfg: Any, ckpt: dict[str, torch.Tensor]) -> nn.Module:
    model = _mod("modeling_magi2").Magi2PreviewTransformer(cfg)
    model.load_weights((f"transformer.{n}", t) for n, t in ckpt.items())
    return model


def _run(model: nn.Module, t: int = 14) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    coords = torch.ones(t, 9)
    coords[:6, 0] = torch.arange(6).float()
    coords[:6, 3] = coords[:6, 6] = 6.0
    modality = torch.tensor([0] * 6 + [1] * 3 + [2] * (t - 9))
    cu = torch.tensor([0, 8, t], dtype=torch.int32)
    with torch.no_grad():
        return model(torch.randn(t, 4, generator=g), coords, modality, _mod("attention").VarlenHandler(cu, cu, 8, 8))


@torch.no_grad()
def test_vllm_omni_loader_fills_the_prepared_layout_in_place(vllm_omni: Path, packing: _InterleavingPreparer) -> None:
    """vllm-omni's load_weights copies into ``state_dict(keep_vars=True)`` entries: with a packing
    provider those are strided views of the prepared storage, and the copy must land there."""
    cfg = _config()
    ckpt = _checkpoint(_mod("modeling_magi2").Magi2PreviewTransformer(cfg))
    integ.register()
    model = _mod("modeling_magi2").Magi2PreviewTransformer(cfg)
    moe = model.block.layers[1].mlp.moe_mlp
    bank = _bank(moe)
    assert not moe.W_gate.is_contiguous() and moe.W_up.untyped_storage().data_ptr() == bank
    calls = packing.calls
    model.load_weights((f"transformer.{n}", t) for n, t in ckpt.items())
    assert _bank(moe) == bank and packing.calls == calls  # filled in place, nothing re-seated or re-packed
    for name, tensor in model.state_dict().items():
        source = name.replace("expert_bias", "expert_bias_ema") if name.endswith("router.expert_bias") else name
        assert torch.equal(tensor, ckpt[source]), name


class _Pipeline(nn.Module):
    """The part of a vllm-omni pipeline its offloader reads: which attribute is the DiT."""

    _dit_modules: ClassVar[list[str]] = ["transformer"]
    _encoder_modules: ClassVar[list[str]] = []
    _vae_modules: ClassVar[list[str]] = []

    def __init__(self, transformer: nn.Module) -> None:
        super().__init__()
        self.transformer = transformer


def _offload(model: nn.Module) -> Any:
    """vllm-omni's LayerWiseOffloadBackend on ``model``'s layers, as its pipeline enables it (CPU
    here: host and device are the same memory, so what is kept alive is watched per storage)."""
    backend_mod = _mod("vllm_omni.diffusion.offloader.layerwise_backend")
    base = _mod("vllm_omni.diffusion.offloader.base")
    strategy = _mod("vllm_omni.diffusion.offloader.config").OffloadStrategy.LAYER_WISE
    discovery = _mod("vllm_omni.diffusion.models.interface").SupportsComponentDiscovery
    pipeline = type("Pipeline", (_Pipeline, discovery), {})
    backend = backend_mod.LayerWiseOffloadBackend(
        base.OffloadConfig(strategy, pin_cpu_memory=False), torch.device("cpu")
    )
    backend.enable(pipeline(model))
    assert backend.enabled and len(backend._dit_hooks) == len(model.block.layers)
    return backend


def _host_copy(backend: Any) -> list[dict[str, int]]:
    """Elements per dtype of each layer's host copy (hook i holds layer i+1's, the ring wrapping)."""
    return [{str(k): v.numel() for k, v in hook.dtype_cpu_flattened_weights.items()} for hook in backend._dit_hooks]


def _watch(model: nn.Module, seen: list[list[StorageWeakRef]]) -> None:
    """Record, per layer run, the storages its parameters use when its MLP/MoE (its last op) is done."""
    for layer in model.block.layers:
        target = getattr(layer.mlp, "moe_mlp", layer.mlp)

        def record(_m: nn.Module, _a: object, _o: object, layer: nn.Module = layer) -> None:
            seen.append([StorageWeakRef(p.untyped_storage()) for p in layer.parameters() if p.numel()])

        target.register_forward_hook(record)


def _alive_after_offload(seen: list[list[StorageWeakRef]]) -> list[int]:
    # every layer, the last one included, has had its offload step once the model returns
    return [sum(not s.expired() for s in storages) for storages in seen]


@pytest.mark.parametrize("device_packs", [False, True], ids=["checkpoint-layout", "packed-on-device"])
def test_layerwise_offload_frees_each_layer_as_upstream(
    vllm_omni: Path, monkeypatch: pytest.MonkeyPatch, device_packs: bool
) -> None:
    """vllm-omni's offloader moves each layer's parameters to a host copy, prefetches them into a
    fresh device buffer before the layer runs and drops them after: nothing of a layer may stay
    alive after its offload step, as with vllm-omni's own layers. With ``packed-on-device`` the
    layer lays its prefetched weights out for a packing provider on every step (as on a GPU); the
    bank it makes belongs to the parameters and goes with them."""
    cfg = _config()
    ckpt = _checkpoint(_mod("modeling_magi2").Magi2PreviewTransformer(cfg))
    outputs, alive, host = {}, {}, {}
    for name in ("upstream", "ours"):
        if name == "ours":  # after vllm-omni's run: its attention function is looked up at each call
            integ.register()
        model = _model(cfg, ckpt)
        resident = _run(model)
        backend = _offload(model)
        host[name] = _host_copy(backend)
        if name == "ours" and device_packs:
            preparer = _InterleavingPreparer()
            monkeypatch.setattr(integ.moe.ops, "prepare_moe_weights", preparer)
            monkeypatch.setattr(integ.moe, "HOST_DEVICE_TYPES", frozenset())
        seen: list[list[StorageWeakRef]] = []
        _watch(model, seen)
        outputs[name] = torch.cat([_run(model), _run(model)])  # two steps: the ring wraps around
        alive[name] = _alive_after_offload(seen)
        assert torch.equal(outputs[name][: len(resident)], resident)  # offloading changes no value
    assert host["ours"] == host["upstream"]
    assert len(alive["ours"]) == 2 * cfg.num_layers
    assert alive["ours"] == alive["upstream"] == [0] * (2 * cfg.num_layers)
    if device_packs:
        assert preparer.calls == 2 * len(cfg.moe.layers)  # once per MoE layer per step
    torch.testing.assert_close(outputs["ours"], outputs["upstream"], rtol=2e-2, atol=2e-2)


def test_layerwise_offload_host_copy_is_upstreams_with_a_packing_provider(
    vllm_omni: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The offloader copies each parameter's whole storage span: were gate and up views of one
    packed bank on the host, each would be copied with the other's span. The host keeps the
    checkpoint layout, so the host copy is vllm-omni's, element for element."""
    cfg = _config()
    ckpt = _checkpoint(_mod("modeling_magi2").Magi2PreviewTransformer(cfg))
    upstream = _model(cfg, ckpt)
    monkeypatch.setattr(integ.moe.ops, "prepare_moe_weights", _InterleavingPreparer())
    integ.register()
    ours = _model(cfg, ckpt)
    assert _host_copy(_offload(ours)) == _host_copy(_offload(upstream))


# ---------------------------------------------------------------------------------------------
# on a GPU: device memory under the offloader, at the production-local MoE shape
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_layerwise_offload_device_memory_is_upstreams(vllm_omni: Path) -> None:
    """Three MoE layers of 3 heads x 256 experts, d 256, I 1280 (BF16) under vllm-omni's offloader
    with the real providers: after each layer's offload step the allocated device memory equals
    vllm-omni's; while a layer runs, ours holds at most the packed gate/up bank more
    (``2 x 768 x 1280 x 256 x 2 B = 1,006,632,960 B``)."""
    cfg_mod = _mod("configuration_magi2")
    cfg = cfg_mod.Magi2PreviewConfig(
        num_layers=3,
        hidden_size=768,
        head_dim=128,
        num_query_groups=6,
        video_in_channels=4,
        audio_in_channels=4,
        text_in_channels=4,
        intermediate_factor=1.0,
        multimodal_layers=(),
        params_dtype=torch.bfloat16,
        mhc=cfg_mod.Magi2MHCConfig(num_streams=2),
        moe=cfg_mod.Magi2MoEConfig(
            num_heads=3,
            num_experts=256,
            top_k=6,
            expert_intermediate_size=1280,
            shared_expert_intermediate_size=256,
            modality_shared_expert_intermediate_size=256,
            layers=(0, 1, 2),
        ),
    )
    bank = 2 * 3 * 256 * 1280 * 256 * 2
    ckpt = _checkpoint(_mod("modeling_magi2").Magi2PreviewTransformer(cfg))
    after: dict[str, list[int]] = {}
    peak: dict[str, int] = {}
    for name in ("upstream", "ours"):
        if name == "ours":
            integ.register()
        model = _model(cfg, ckpt)
        backend_mod = _mod("vllm_omni.diffusion.offloader.layerwise_backend")
        base = _mod("vllm_omni.diffusion.offloader.base")
        strategy = _mod("vllm_omni.diffusion.offloader.config").OffloadStrategy.LAYER_WISE
        pipeline = type("P", (_Pipeline, _mod("vllm_omni.diffusion.models.interface").SupportsComponentDiscovery), {})
        backend = backend_mod.LayerWiseOffloadBackend(base.OffloadConfig(strategy), torch.device("cuda"))
        backend.enable(pipeline(model))
        seen: list[int] = []
        after[name] = seen
        for layer in model.block.layers:
            layer.register_forward_hook(lambda *_, seen=seen: seen.append(torch.cuda.memory_allocated()))
        t = 4096
        coords = torch.ones(t, 9, device="cuda")
        modality = torch.tensor([0] * 3500 + [1] * 400 + [2] * (t - 3900), device="cuda")
        cu = torch.tensor([0, t], dtype=torch.int32, device="cuda")
        x = torch.randn(t, 4, device="cuda")
        varlen = _mod("attention").VarlenHandler(cu, cu, t, t)
        with torch.no_grad():
            model(x, coords, modality, varlen)  # warm-up: kernels compiled, caches filled
            torch.cuda.synchronize()
            seen.clear()
            torch.cuda.reset_peak_memory_stats()
            start = torch.cuda.memory_allocated()
            model(x, coords, modality, varlen)
            torch.cuda.synchronize()
        after[name] = [a - start for a in seen]
        peak[name] = torch.cuda.max_memory_allocated() - start
        backend.disable()
        del model, backend
        torch.cuda.empty_cache()
    slack = 2**20  # allocator granularity; a layer kept alive would be 1.5 GB
    assert len(after["ours"]) == len(after["upstream"]) == cfg.num_layers
    assert all(abs(a - b) <= slack for a, b in zip(after["ours"], after["upstream"], strict=True)), (after, peak)
    assert peak["ours"] - peak["upstream"] <= bank + 2**28, peak  # + the routed activations' buffers
