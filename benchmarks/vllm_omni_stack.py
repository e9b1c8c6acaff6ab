"""A stack of MAGI-2 layers built from vllm-omni 0.30.0's own modules: plugin off vs on, eager and compiled.

    python -m benchmarks.vllm_omni_stack --wheel vllm_omni-0.30.0-py3-none-any.whl \\
        --out benchmarks/results/vllm_omni_stack_h200.json
    python -m benchmarks.vllm_omni_stack --wheel DIR --smoke --out /tmp/vllm_omni_stack_smoke.json  # CPU, tiny

The model is vllm-omni's ``Magi2PreviewTransformer`` (its own modules, imported unmodified from the
wheel or an unpacked directory, vLLM stubbed: ``benchmarks/_vllm_stubs.py``) at the release
config's widths (hidden 3072, 24 x 128 attention heads, 4 mHC streams, 12 MoE heads x 256 experts,
top-6, I 1280, BF16) with L MoE layers (default 4), each with its own random weights, on one GPU.
Two copies hold the same weights: one built before the plugin ran (vllm-omni's operators: vLLM's
bundled FlashAttention, here an installed FA3 build, plus the torch sink correction; its Triton MoE;
its torch RMSNorm) and one after (magi2-core's). Each is timed eager, then after vllm-omni's
``compile_regions`` with the arguments vllm-omni's pipeline passes (``fullgraph=True, dynamic=True,
options={"emulate_precision_casts": True}``: the dense code between attention and MoE compiled, the
attention and MoE kernels eager).

Timed: ``model.block(...)``, the L layers on one pack (one sequence) of T tokens (default 4096 and
14601), per layer = block time / L; CUDA events, a buffer larger than the L2 zeroed before every call,
off and on alternating (benchmarks/_common). Before timing, both outputs are checked finite and
their relative L2 difference is recorded (the swapped operators round differently; a flipped route
makes it larger). magi2-core runs in strict mode: a GPU call served by its slow reference raises.
A variant that cannot run (a compile failure) is recorded with its error, the others still run, and
the exit status is 1. On a GPU, one more call of each variant per mode runs under the torch profiler:
its kernels sorted into the layer's operators (``benchmarks/_breakdown.py``), divided by L, under
``breakdown``.

Needs torch and Triton; no vLLM. ``--smoke`` runs a tiny configuration on the CPU, compiled with
``backend="eager"`` (dynamo's capture, no inductor), to check the script.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import sys
import tempfile
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import magi2_core as m2
from benchmarks import _vllm_stubs as stubs
from benchmarks._breakdown import GemmWidths, breakdown, profile_call
from benchmarks._common import env_record, in_run_order, stats, time_alternating

PKG = "vllm_omni.diffusion.models.magi2"
GPU_COMPILE: dict[str, Any] = {"fullgraph": True, "dynamic": True, "options": {"emulate_precision_casts": True}}
SMOKE_COMPILE: dict[str, Any] = {"fullgraph": True, "dynamic": True, "backend": "eager"}
MODES = ("eager", "compiled")  # in run order: compile_regions compiles the model in place


def _mod(name: str) -> Any:
    return importlib.import_module(f"{PKG}.{name}")


def stack_config(layers: int, smoke: bool) -> Any:
    """vllm-omni's config: the release's widths with ``layers`` MoE layers (smoke: tiny widths)."""
    cfg = _mod("configuration_magi2")
    moe_layers = tuple(range(layers))
    if not smoke:
        release = cfg.Magi2PreviewConfig()
        return dataclasses.replace(
            release, num_layers=layers, multimodal_layers=(), moe=dataclasses.replace(release.moe, layers=moe_layers)
        )
    return cfg.Magi2PreviewConfig(
        num_layers=layers,
        hidden_size=64,
        head_dim=16,
        num_query_groups=4,
        video_in_channels=4,
        audio_in_channels=4,
        text_in_channels=8,
        intermediate_factor=1.0,
        multimodal_layers=(),
        mhc=cfg.Magi2MHCConfig(num_streams=2),
        moe=cfg.Magi2MoEConfig(
            num_heads=4,
            num_experts=8,
            top_k=2,
            expert_intermediate_size=32,
            shared_expert_intermediate_size=16,
            modality_shared_expert_intermediate_size=16,
            layers=moe_layers,
        ),
    )


@torch.no_grad()
def randomize(model: nn.Module, seed: int) -> None:
    """Fresh random weights at unit-preserving scales (fan-in), small norm deltas, biases and sinks;
    the RoPE bands keep their defined values."""
    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "bands":
            continue
        if leaf in ("W_gate", "W_up", "W_down"):
            std = p.shape[1] ** -0.5
        elif leaf.startswith("mhc_phi_fused"):
            std = p.shape[0] ** -0.5
        elif p.dim() >= 2:
            std = p.shape[-1] ** -0.5
        else:
            std = 0.05
        p.copy_((torch.randn(p.shape, generator=g, device=p.device) * std).to(p.dtype))


@dataclasses.dataclass
class Pack:
    """One packed sequence of T tokens as ``Magi2TransformerBlock.forward`` takes it."""

    hidden: torch.Tensor
    rope: torch.Tensor
    varlen: Any
    dispatcher: Any


@dataclasses.dataclass
class Variant:
    """One model and the packed-attention function its layers call. vllm-omni looks that function
    up in its attention module on every call, whichever model calls it: each variant puts its own in
    place before it runs (one attribute store, outside any compiled region)."""

    model: nn.Module
    attention: Callable[..., torch.Tensor]

    def __call__(self, pack: Pack) -> torch.Tensor:
        _mod("attention").packed_attention_with_sink = self.attention
        out: torch.Tensor = self.model.block(
            pack.hidden, pack.rope, pack.varlen, pack.dispatcher, [pack.hidden.shape[0]]
        )
        return out


def build_variants(cfg: Any, dev: str) -> tuple[Variant, Variant]:
    """vllm-omni's model built without the plugin and with it, the same weights in both."""
    from magi2_core.integrations import vllm_omni as integ

    modeling = _mod("modeling_magi2")
    theirs = _mod("attention").packed_attention_with_sink
    with torch.device(dev):
        off = modeling.Magi2PreviewTransformer(cfg)
    randomize(off, seed=30)
    methods = upstream_methods(modeling)
    integ.register()  # modeling is imported: the swap applies now, to models built from here on
    with torch.device(dev):
        on = modeling.Magi2PreviewTransformer(cfg)
    on.load_state_dict(off.state_dict(), strict=True)
    if type(on.block.layers[0].mlp.moe_mlp) is not integ.Magi2MultiHeadMoE:
        raise RuntimeError("the plugin did not swap vllm-omni's MoE layer (see the magi2_core log lines)")
    keep_upstream_methods(off, methods)
    return (
        Variant(off.eval().requires_grad_(False), theirs),
        Variant(on.eval().requires_grad_(False), integ.packed_attention_with_sink),
    )


def upstream_methods(modeling: Any) -> dict[tuple[str, str], Any]:
    """vllm-omni's own methods that the plugin may swap (the layer's mHC, the attention's ``project`` and
    ``output``, the MoE layer's shared experts), by (class name, method name), read before the plugin
    registers."""
    from magi2_core.integrations.vllm_omni.gate import METHODS as OUTPUT
    from magi2_core.integrations.vllm_omni.mhc import METHODS
    from magi2_core.integrations.vllm_omni.qk_rope import METHODS as PROJECT
    from magi2_core.integrations.vllm_omni.shared_experts import METHODS as SHARED

    owners = {"Magi2TransformerLayer": METHODS, "Magi2Attention": PROJECT + OUTPUT, "Magi2MultiHeadMoELayer": SHARED}
    return {(cls, name): getattr(getattr(modeling, cls), name) for cls, names in owners.items() for name in names}


def keep_upstream_methods(model: nn.Module, methods: dict[tuple[str, str], Any]) -> set[str]:
    """Bind vllm-omni's own methods on ``model``'s modules where the plugin swapped them on the class.

    A method swap (mHC, q/k RoPE, output gate, shared experts) replaces methods on vllm-omni's class,
    which a model built before the plugin ran shares; bound on the instances, plugin off keeps
    upstream's. Returns the classes whose methods had been swapped.
    """
    swapped: set[str] = set()
    for module in model.modules():
        cls = type(module)
        for (owner, name), fn in methods.items():
            if cls.__name__ == owner and getattr(cls, name) is not fn:
                setattr(module, name, types.MethodType(fn, module))
                swapped.add(owner)
    return swapped


def make_pack(model: nn.Module, cfg: Any, tokens: int, dev: str) -> Pack:
    """A video-audio-text pack: 85 % video tokens on a (frames, 16, 16) grid, 10 % audio, the rest text."""
    g = torch.Generator(device=dev).manual_seed(tokens)
    video, audio = int(tokens * 0.85), int(tokens * 0.10)
    frames = math.ceil(video / 256)
    i = torch.arange(video, device=dev)
    coords = torch.ones(tokens, 9, device=dev)
    coords[:video, :3] = torch.stack((i // 256, i // 16 % 16, i % 16), dim=-1).float()
    coords[:video, 3:6] = coords[:video, 6:] = torch.tensor([frames, 16.0, 16.0], device=dev)
    coords[video : video + audio, 0] = torch.arange(audio, device=dev).float()
    coords[video : video + audio, 3] = coords[video : video + audio, 6] = float(audio)
    modality = torch.cat(
        [torch.full((n,), m, device=dev) for m, n in enumerate((video, audio, tokens - video - audio))]
    )
    cu = torch.tensor([0, tokens], dtype=torch.int32, device=dev)
    hidden = torch.randn(tokens, cfg.virtual_width, generator=g, device=dev).to(cfg.params_dtype)
    return Pack(
        hidden=hidden,
        rope=model.pre_adapter.rope(coords),
        varlen=_mod("attention").VarlenHandler(cu, cu, tokens, tokens),
        dispatcher=_mod("layers").ModalityDispatcher(modality, 3),
    )


def providers(model: nn.Module, cfg: Any, pack: Any) -> dict[str, str | None]:
    """What the plugin-on model's first MoE layer's calls resolve to (``magi2 explain`` says why)."""
    layer = next(layer for layer in model.block.layers if hasattr(layer.mlp, "moe_mlp"))
    t, dev, dt = pack.hidden.shape[0], pack.hidden.device, cfg.params_dtype
    q = torch.randn(t, cfg.num_heads_q, cfg.head_dim, device=dev).to(dt)
    kv = torch.randn(t, cfg.num_heads_kv, cfg.head_dim, device=dev).to(dt)
    cu = torch.tensor([0, t], dtype=torch.int32, device=dev)
    moe = layer.mlp.moe_mlp
    heads = torch.randn(t, moe.num_heads, moe.d_head, device=dev).to(dt)
    probs, idx = m2.moe_route(heads, moe.gate, moe.router.expert_bias_ema, top_k=moe.top_k, route_scale=4.9)
    x = torch.randn(t, cfg.hidden_size, device=dev).to(dt)
    norm_weight = layer.mlp.pre_norm.weight.view(3, 1, -1)
    sizes = list(pack.dispatcher.group_size_cpu)
    sinks = layer.attention.sinks.float()
    return {
        "attention": m2.resolve("attention", q, kv, kv, cu, cu, max_seqlen_q=t, max_seqlen_k=t, sinks=sinks).chosen,
        "moe_route": m2.resolve("moe_route", heads, moe.gate, moe.router.expert_bias_ema, top_k=moe.top_k).chosen,
        "moe_experts": m2.resolve("moe_experts", heads, probs, idx, moe.prepared_weights()).chosen,
        "rmsnorm": m2.resolve("rmsnorm", x, norm_weight, modality_sizes=sizes).chosen,
        **mhc_providers(layer, pack),
        "qk_norm_rope": qk_rope_provider(layer, pack),
        "output_gate": output_gate_provider(layer, pack),
    }


def qk_rope_provider(layer: nn.Module, pack: Any) -> str | None:
    """What the attention's q/k tail resolves to when the plugin swapped ``project`` (else: nothing)."""
    from magi2_core.integrations.vllm_omni.qk_rope import AttentionProjectMethods

    attention = layer.attention
    if type(attention).project is not AttentionProjectMethods.project:
        return None
    q = pack.hidden.new_empty(pack.hidden.shape[0], attention.num_heads_q, attention.head_dim)
    norm = attention.q_norm
    sizes = list(pack.dispatcher.group_size_cpu) if norm.num_modality > 1 else None
    index = pack.dispatcher.inv_permute_mapping
    return m2.resolve("qk_norm_rope", q, norm.weight, pack.rope, modality_sizes=sizes, index=index).chosen


def output_gate_provider(layer: nn.Module, pack: Any) -> str | None:
    """What the attention's output gate resolves to when the plugin swapped ``output`` (else: nothing)."""
    from magi2_core.integrations.vllm_omni.gate import AttentionOutputMethods

    attention = layer.attention
    if type(attention).output is not AttentionOutputMethods.output:
        return None
    t = pack.hidden.shape[0]
    o = pack.hidden.new_empty(t, attention.num_heads_q, attention.head_dim)
    gates = pack.hidden.new_empty(t, attention.num_heads_q, 1)
    return m2.resolve("output_gate", o, gates, index=pack.dispatcher.permute_mapping).chosen


def mhc_providers(layer: nn.Module, pack: Any) -> dict[str, str | None]:
    """What the layer's mHC calls resolve to when the plugin swapped them in (else: nothing)."""
    from magi2_core.integrations.vllm_omni.mhc import MHCLayerMethods

    if type(layer)._branch_logits is not MHCLayerMethods._branch_logits:
        return {"mhc_pre": None, "mhc_mix": None}
    streams = pack.hidden.view(pack.hidden.shape[0], layer.config.mhc.num_streams, -1)
    args = (
        streams,
        layer.mhc_norm.weight,
        *(
            getattr(layer, f"mhc_{name}_attn")
            for name in ("phi_fused", "alpha_pre", "alpha_post", "alpha_res", "bias_pre", "bias_post", "bias_res")
        ),
    )
    sizes = list(pack.dispatcher.group_size_cpu) if layer.mhc_norm.num_modality > 1 else None
    branch_input, post, residual = m2.mhc_pre(*args, modality_sizes=sizes)
    return {
        "mhc_pre": m2.resolve("mhc_pre", *args, modality_sizes=sizes).chosen,
        "mhc_mix": m2.resolve("mhc_mix", streams, branch_input, post, residual).chosen,
    }


def layer_breakdown(variant: Variant, pack: Pack, cfg: Any, layers: int) -> dict[str, Any]:
    """One block call under the profiler, sorted by operator, every time divided by ``layers`` (each
    kernel's, before the sums): ``kernel_ms`` and the categories' ``ms`` are per layer, ``launches``
    those of the whole block call."""
    kernels = [dataclasses.replace(k, us=k.us / layers) for k in profile_call(lambda: variant(pack))]
    return {"per_layer_of": layers, **breakdown(kernels, GemmWidths.of(cfg))}


def bench_pack(off: Variant, on: Variant, pack: Pack, layers: int, iters: int, dev: str) -> dict[str, Any]:
    want, got = off(pack), on(pack)
    finite = bool(torch.isfinite(want).all() and torch.isfinite(got).all())
    rel_l2 = float((got.double() - want.double()).norm() / want.double().norm())
    fns: dict[str, Callable[[], object]] = {"off": lambda: off(pack), "on": lambda: on(pack)}
    times = time_alternating(fns, iters, warmup=2, device=dev)
    per_layer = {k: stats([v / layers for v in s]) for k, s in times.items()}
    return {
        "ms_per_layer": per_layer,
        "speedup": per_layer["off"]["p50"] / per_layer["on"]["p50"],
        "finite": finite,
        "rel_l2_on_vs_off": rel_l2,
    }


def run(
    source: Path, out: Path, *, layers: int, tokens: Sequence[int], iters: int, modes: Sequence[str], smoke: bool
) -> dict[str, Any]:
    dev = "cpu" if smoke else "cuda"
    if not smoke:
        m2.set_strict(True)
    cfg = stack_config(layers, smoke)
    off, on = build_variants(cfg, dev)
    shape = {
        "layers": layers,
        "moe_layers": layers,
        "hidden": cfg.hidden_size,
        "heads_q": cfg.num_heads_q,
        "heads_kv": cfg.num_heads_kv,
        "head_dim": cfg.head_dim,
        "mhc_streams": cfg.mhc.num_streams,
        "moe_heads": cfg.moe.num_heads,
        "experts": cfg.moe.num_experts,
        "top_k": cfg.moe.top_k,
        "expert_intermediate": cfg.moe.expert_intermediate_size,
        "dtype": str(cfg.params_dtype),
        "expert_parallel": 1,
        "smoke": smoke,
    }
    report: dict[str, Any] = {
        **env_record(dev),
        "magi2_core": m2.__version__,
        "vllm_omni": stubs.VERSION,
        "vllm_omni_from": str(source),
        "config": shape,
        "compile_regions": SMOKE_COMPILE if smoke else GPU_COMPILE,
        "method": "model.block on one pack, per layer = block time / L; CUDA events, L2 flushed before each "
        "call, plugin off/on alternating (benchmarks/_common); eager first, then compile_regions on both",
        "results": [],
        "breakdown": [],
        "errors": [],
    }
    with torch.inference_mode():
        packs = {t: make_pack(off.model, cfg, t, dev) for t in tokens}
        report["providers"] = {}
        for t, pack in packs.items():
            try:
                report["providers"][str(t)] = providers(on.model, cfg, pack)
            except m2.Magi2Error as exc:  # strict mode: a GPU call the reference would serve
                report["errors"].append({"tokens": t, "mode": "resolution", "error": f"{type(exc).__name__}: {exc}"})
        for mode in in_run_order(modes, MODES):
            if mode == "compiled":
                for variant in (off, on):
                    variant.model.compile_regions(**(SMOKE_COMPILE if smoke else GPU_COMPILE))
            for t, pack in packs.items():
                try:
                    result = {"tokens": t, "mode": mode, **bench_pack(off, on, pack, layers, iters, dev)}
                except Exception as exc:  # a variant that cannot run is a result; the others still run
                    report["errors"].append({"tokens": t, "mode": mode, "error": f"{type(exc).__name__}: {exc}"})
                    print(f"T={t} {mode}: FAILED {type(exc).__name__}: {exc}", flush=True)
                    continue
                report["results"].append(result)
                if dev != "cpu":
                    for plugin, variant in (("off", off), ("on", on)):
                        rows = layer_breakdown(variant, pack, cfg, layers)
                        report["breakdown"].append({"tokens": t, "mode": mode, "plugin": plugin, **rows})
                        top = ", ".join(f"{c} {r['ms']:.3f}" for c, r in rows["categories"].items())
                        print(f"T={t} {mode} plugin {plugin}: kernel ms/layer {rows['kernel_ms']}: {top}")
                per = result["ms_per_layer"]
                print(
                    f"T={t} {mode}: ms/layer off {per['off']['p50']:.3f} on {per['on']['p50']:.3f}, speed-up "
                    f"{result['speedup']:.2f}x; rel L2 on vs off {result['rel_l2_on_vs_off']:.2e}",
                    flush=True,
                )
                out.write_text(json.dumps(report, indent=1))
    out.write_text(json.dumps(report, indent=1))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument(
        "--wheel", required=True, type=Path, help="vllm-omni 0.30.0's wheel, or a directory holding vllm_omni/"
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", type=int, nargs="+", help="tokens per pack (default 4096 14601; smoke: 40 17)")
    p.add_argument("--iters", type=int, help="timed calls per variant (default 20; smoke: 2)")
    p.add_argument(
        "--modes", nargs="+", choices=MODES, default=list(MODES), help="run in this order whatever the order given"
    )
    p.add_argument("--smoke", action="store_true", help="tiny configuration on the CPU (checks the script only)")
    a = p.parse_args(argv)
    if not a.smoke and not torch.cuda.is_available():
        p.error("needs a CUDA GPU (or --smoke)")
    tokens = a.tokens or ([40, 17] if a.smoke else [4096, 14601])
    iters = a.iters or (2 if a.smoke else 20)
    if a.layers < 1:
        p.error("--layers must be >= 1")
    from magi2_core.integrations import vllm_omni as integ

    with tempfile.TemporaryDirectory() as tmp:
        root = stubs.unpack(a.wheel, Path(tmp))
        stubs.install(root)
        try:
            report = run(a.wheel, a.out, layers=a.layers, tokens=tokens, iters=iters, modes=a.modes, smoke=a.smoke)
        finally:
            integ.unregister()
            stubs.uninstall()
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
