"""One MAGI-2 DiT step: vllm-omni 0.30.0's whole 40-layer transformer, plugin off vs on, per mode.

    python -m benchmarks.dit_step --wheel vllm_omni-0.30.0-py3-none-any.whl \\
        --out benchmarks/results/dit_step_h200.json
    python -m benchmarks.dit_step --wheel DIR --smoke --out /tmp/dit_step_smoke.json   # CPU, tiny

**The model.** vllm-omni's ``Magi2PreviewTransformer`` at the released config (40 layers: the
multimodal dense layers 0, 1, 38, 39 and the 36 MoE layers 2-37; hidden 3072, 24 x 128 heads, mHC
4 streams, 12 MoE heads x 256 experts, top-6, BF16), its own modules imported unmodified from the
wheel with vLLM stubbed (``benchmarks/_vllm_stubs.py``), random weights. Plugin off is vllm-omni's
operators; plugin on is the same model built after :func:`magi2_core.integrations.vllm_omni.register`,
holding the same weights (magi2-core in strict mode: a GPU call served by the slow reference raises).

**The step.** vllm-omni's sampler runs one transformer forward per denoising step on a pack of the
two classifier-free-guidance branches (conditional and unconditional, ``prepare_model_input``: the
latents twice, the prompt and the negative prompt padded to one length); with CFG parallelism each
rank runs one branch. This script builds that pack for 272p / 10 s the way the pipeline does:
``_evaluate_preview`` draws the video latent ``[1, 48, 32, 16, 28]`` (256x448 / 16, 250 internal
frames / 8 + 1) and the audio latent ``[1, 250, 64]`` (10 s x 25 latent frames); vllm-omni's own
``Magi2DataProxy.process_input`` packs them (video tokens ``32 x 16 x 28 = 14,336`` and 250 audio
tokens per branch). The text length is the one number that needs the text encoder: both prompts
are padded to the longer, which is the default negative prompt (1,721 characters, 211 words);
``--text-tokens`` (default 370, an estimate of its Qwen3.5 token count) sets it. A step is
``model(*packed.model_args)``: one forward over the pack (``form="forward"``), timed; the 40-layer
``model.block`` alone (``form="block"``) is timed too, since it is what a CUDA graph can capture
(the adapters index by ``nonzero`` and the RoPE checks its scales on the host).

**The weights.** The model's 36 MoE banks (``W_gate``/``W_up``/``W_down``, 6 GB each in BF16) are
more than one GPU holds, so the MoE layers share ``--banks`` banks round-robin (default 1); each bank
is a hundred times the L2, so a layer reads its bank from memory whether or not the previous layer
read the same one. ``form="distinct-banks"`` checks that claim: a 4-MoE-layer stack with 4 banks
against the same stack with one, per layer. Every other weight is the layer's own.

**Modes.** ``eager``; ``compiled``: vllm-omni's ``compile_regions`` with the arguments its pipeline
passes (``fullgraph=True, dynamic=True, emulate_precision_casts``); ``graph``: the compiled regions
and the eager kernels of ``model.block`` captured in one CUDA graph and replayed (a variant that
cannot be captured is recorded with its error). Per mode and plugin: seconds per step (p50, p10-p90
over ``--iters`` calls, CUDA events, L2 flushed before each call, off and on alternating), the peak
memory of a call, and a per-op breakdown of one call from the torch profiler (``benchmarks/_breakdown.py``).
The dynamo counters (graphs, recompiles, graph breaks) are recorded after compiling.

**The arithmetic.** ``work``: the step's matrix products per breakdown category, counted from the
config and the pack (``benchmarks/_step_flops.py``); on a GPU, this device's ceilings measured in the
same run and ``matmul_floor_s``, the step's BF16 products at the measured matmul rate (a floor: no
FP32 product, memory-bound operator or launch counted).

**One rank of EP4.** ``form="ep4-rank-memory"``: the plugin-on model built as rank 0 of 4-way
expert parallelism (3 of the 12 MoE heads in each of the 36 MoE layers, each layer its own bank,
every dense weight), allocated on the GPU, plus a block of the plugin-on eager step's activation
peak (an upper bound: under Ulysses a rank holds a quarter of the tokens outside attention).

Needs torch, Triton and einops (vllm-omni's data proxy); no vLLM. ``--smoke`` runs a tiny
configuration with the same layer layout on the CPU (compiled with ``backend="eager"``), to keep the
script working.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

import magi2_core as m2
from benchmarks import _vllm_stubs as stubs
from benchmarks._breakdown import GemmWidths, breakdown, profile_call
from benchmarks._common import env_record, graphed, in_run_order, measure_ceilings, stats, time_alternating
from benchmarks._step_flops import matmul_floor_s, step_work
from benchmarks.vllm_omni_stack import (
    GPU_COMPILE,
    SMOKE_COMPILE,
    _mod,
    keep_upstream_methods,
    randomize,
    upstream_methods,
)

BANK_NAMES = ("W_gate", "W_up", "W_down")
TEXT_TOKENS = 370
MODES = ("eager", "compiled", "graph")  # in run order: compile_regions compiles the model in place
GIB = 2**30


# -- the model and its input -------------------------------------------------------------------------


def model_config(smoke: bool, *, num_layers: int | None = None, moe_only: bool = False) -> Any:
    """The release config (smoke: tiny widths, the release's layout of dense and MoE layers).
    ``moe_only``: ``num_layers`` MoE layers and nothing else (the distinct-banks check)."""
    cfg = _mod("configuration_magi2")
    release = cfg.Magi2PreviewConfig()
    if not smoke:
        base = release
    else:
        base = cfg.Magi2PreviewConfig(
            num_layers=6,
            hidden_size=64,
            head_dim=16,
            num_query_groups=4,
            video_in_channels=4,
            audio_in_channels=4,
            text_in_channels=8,
            intermediate_factor=1.0,
            multimodal_layers=(0, 1, 4, 5),
            mhc=cfg.Magi2MHCConfig(num_streams=2),
            moe=cfg.Magi2MoEConfig(
                num_heads=4,
                num_experts=8,
                top_k=2,
                expert_intermediate_size=32,
                shared_expert_intermediate_size=16,
                modality_shared_expert_intermediate_size=16,
                layers=(2, 3),
            ),
        )
    if not moe_only:
        return base
    n = num_layers or 4
    return dataclasses.replace(
        base, num_layers=n, multimodal_layers=(), moe=dataclasses.replace(base.moe, layers=tuple(range(n)))
    )


@dataclasses.dataclass(frozen=True)
class StepShape:
    """The latents of one request, as vllm-omni's pipeline draws them."""

    video: tuple[int, int, int, int, int]  # [1, C, T, H, W]
    audio: tuple[int, int, int]  # [1, L, C]
    text_tokens: int
    text_channels: int


def step_shape(smoke: bool, text_tokens: int) -> StepShape:
    """272p / 10 s: 256x448 pixels, 125 output frames on the internal 25 fps timeline (250 frames),
    the VAE strides (8, 16, 16); audio at 25 latent frames per second (vllm-omni's generation config)."""
    if smoke:
        return StepShape(video=(1, 4, 3, 2, 4), audio=(1, 5, 4), text_tokens=min(text_tokens, 6), text_channels=8)
    gen = _mod("configuration_magi2").MAGI2_GENERATION_CONFIG
    width, height = 448, 256  # vllm-omni's "272p" preset
    frames = round(gen.duration_seconds * gen.fps) * 2
    t = (frames - 1) // gen.video_vae_stride[0] + 1
    h, w = height // gen.video_vae_stride[1], width // gen.video_vae_stride[2]
    audio = round(gen.duration_seconds * gen.audio_latent_fps)
    return StepShape(
        video=(1, gen.video_latent_channels, t, h, w),
        audio=(1, audio, gen.audio_latent_channels),
        text_tokens=text_tokens,
        text_channels=5120,
    )


def step_input(shape: StepShape, dev: str, *, timestep: float = 500.0) -> Any:
    """The CFG pack of one denoising step: both branches of ``shape`` through vllm-omni's data proxy."""
    proxy = _mod("preview_data_proxy")
    g = torch.Generator(device=dev).manual_seed(7)
    latent = torch.randn(shape.video, generator=g, device=dev)
    audio = torch.randn(shape.audio, generator=g, device=dev)
    text = torch.randn(1, shape.text_tokens, shape.text_channels, generator=g, device=dev).to(torch.bfloat16)
    null_text = torch.randn(1, shape.text_tokens, shape.text_channels, generator=g, device=dev).to(torch.bfloat16)
    t = torch.full((2,), timestep / 1000.0, device=dev)
    _, _, vt, vh, vw = shape.video
    model_input = proxy.ModelInput(
        x_t=torch.cat((latent, latent)),
        audio_x_t=torch.cat((audio, audio)),
        audio_feat_len=[shape.audio[1]] * 2,
        txt_feat=torch.cat((text, null_text)),
        txt_feat_len=[shape.text_tokens] * 2,
        t=t,
        per_token_video_t=t.view(-1, 1, 1, 1, 1).expand(2, 1, vt, vh, vw),
        per_token_audio_t=t.view(-1, 1, 1).expand(2, shape.audio[1], 1),
    )
    return proxy.Magi2DataProxy().process_input(model_input)


def pack_summary(packed: Any) -> dict[str, Any]:
    layout = packed.output_layout
    items = [
        {"video": it.video_token_num, "audio": it.audio_feat_len, "text": it.txt_feat_len, "total": it.total_token_num}
        for it in layout.items
    ]
    return {
        "tokens": layout.total_token_num,
        "sequences": len(items),
        "per_sequence": items,
        "max_seqlen": layout.max_seqlen,
    }


@torch.no_grad()
def make_bank(moe: nn.Module, dev: str, seed: int) -> tuple[nn.Parameter, ...]:
    """One MoE layer's expert weights at fan-in scales, as parameters that several layers can hold."""
    g = torch.Generator(device=dev).manual_seed(seed)
    bank = []
    for name in BANK_NAMES:
        p = getattr(moe, name)
        t = torch.empty(p.shape, dtype=p.dtype, device=dev)
        for row in range(0, p.shape[0], 256):  # in slices: no FP32 copy of a 6 GB bank
            rows = t[row : row + 256]
            rows.copy_(torch.randn(rows.shape, generator=g, device=dev) * p.shape[1] ** -0.5)
        bank.append(nn.Parameter(t, requires_grad=False))
    return tuple(bank)


def _moe_modules(model: nn.Module) -> list[nn.Module]:
    return [layer.mlp.moe_mlp for layer in model.block.layers if hasattr(layer.mlp, "moe_mlp")]


@torch.no_grad()
def materialize(model: nn.Module, dev: str, banks: Sequence[tuple[nn.Parameter, ...]]) -> None:
    """Give a model built on the meta device real storage: the MoE layers hold ``banks`` round-robin,
    every other parameter its own tensor. Values: the RoPE bands as vllm-omni defines them, the rest
    unset (copy or randomize them next)."""
    moes = _moe_modules(model) if banks else []  # no banks: each MoE layer gets its own below
    for i, moe in enumerate(moes):
        for name, p in zip(BANK_NAMES, banks[i % len(banks)], strict=True):
            setattr(moe, name, p)
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and p.is_meta:
                module._parameters[name] = nn.Parameter(
                    torch.empty(p.shape, dtype=p.dtype, device=dev), requires_grad=False
                )
        for name, b in list(module._buffers.items()):
            if b is not None and b.is_meta:
                module._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device=dev)
    rope = model.pre_adapter.rope
    fresh = type(rope)(rope.dim, temperature=rope.temperature, learnable=False, device=dev)
    rope.bands.copy_(fresh.bands)


def share_prepared_layouts(model: nn.Module) -> None:
    """Plugin on: lay each shared bank out once, then let every layer that holds it use that layout.
    (The layer re-lays-out weights whose storage moved; layers sharing parameters would otherwise take
    turns re-laying-out the same bank on every forward.)"""
    seen: dict[int, Any] = {}
    for moe in _moe_modules(model):
        key = id(moe.W_gate)
        if key not in seen:
            moe.prepare_weights()
            seen[key] = moe._layout  # benchmark-only: share the geometry of one bank between layers
        else:
            moe._layout = seen[key]


def build_pair(cfg: Any, dev: str, banks: int, *, seed: int = 30) -> tuple[nn.Module, nn.Module]:
    """vllm-omni's model built without and with the plugin, the same weights in both."""
    from magi2_core.integrations import vllm_omni as integ

    modeling = _mod("modeling_magi2")
    with torch.device("meta"):
        off = modeling.Magi2PreviewTransformer(cfg)
    moes = _moe_modules(off)
    off_banks = [make_bank(moes[0], dev, seed + 1000 + b) for b in range(min(banks, len(moes)) or 1)] if moes else []
    materialize(off, dev, off_banks)
    banked = {id(p) for bank in off_banks for p in bank}
    with torch.no_grad():
        for name, p in off.named_parameters():  # named_parameters yields a shared bank once
            if id(p) not in banked and not name.endswith("bands"):
                p.copy_(_random_like(p, name, seed))
    methods = upstream_methods(modeling)
    integ.register()  # the swap applies to models built from here on
    with torch.device("meta"):
        on = modeling.Magi2PreviewTransformer(cfg)
    on_banks = [tuple(nn.Parameter(p.detach().clone(), requires_grad=False) for p in bank) for bank in off_banks]
    materialize(on, dev, on_banks)
    with torch.no_grad():
        theirs = dict(off.named_parameters(remove_duplicate=False))
        for name, p in on.named_parameters(remove_duplicate=False):
            if name.rsplit(".", 1)[-1] not in BANK_NAMES:
                p.copy_(theirs[name])
    share_prepared_layouts(on)
    keep_upstream_methods(off, methods)
    if moes and type(_moe_modules(on)[0]) is not integ.Magi2MultiHeadMoE:
        raise RuntimeError("the plugin did not swap vllm-omni's MoE layer (see the magi2_core log lines)")
    return off.eval().requires_grad_(False), on.eval().requires_grad_(False)


def _random_like(p: torch.Tensor, name: str, seed: int) -> torch.Tensor:
    """The stack benchmark's scales (``vllm_omni_stack.randomize``) for one parameter, seeded by name."""
    holder = nn.Module()
    holder.register_parameter(name.rsplit(".", 1)[-1], nn.Parameter(torch.empty_like(p), requires_grad=False))
    randomize(holder, seed=seed + zlib.crc32(name.encode()))
    return next(holder.parameters())


# -- timing ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Variant:
    """One model and the packed-attention function its layers call (vllm-omni looks it up in its
    attention module on every call: each variant puts its own in place before it runs)."""

    model: nn.Module
    attention: Callable[..., torch.Tensor]

    def use(self) -> None:
        _mod("attention").packed_attention_with_sink = self.attention


def forward_fn(v: Variant, packed: Any) -> Callable[[], torch.Tensor]:
    def call() -> torch.Tensor:
        v.use()
        out: torch.Tensor = v.model(*packed.model_args)
        return out

    return call


def block_fn(v: Variant, packed: Any, pack: Any) -> Callable[[], torch.Tensor]:
    """``model.block`` on the pack's hidden states, rope and dispatcher, built once outside."""

    def call() -> torch.Tensor:
        v.use()
        out: torch.Tensor = v.model.block(pack.hidden, pack.rope, pack.varlen, pack.dispatcher, [pack.hidden.shape[0]])
        return out

    return call


@dataclasses.dataclass
class BlockInput:
    hidden: torch.Tensor
    rope: torch.Tensor
    varlen: Any
    dispatcher: Any


def block_input(model: nn.Module, packed: Any, dev: str) -> BlockInput:
    """What ``model.forward`` hands ``model.block`` for this pack (the adapters' output, the RoPE)."""
    x, coords, modality, varlen, time_tokens = packed.model_args
    modeling = _mod("modeling_magi2")
    modality = torch.where(modality == int(modeling.Modality.TIME), int(modeling.Modality.TEXT), modality)
    idx = [
        torch.nonzero(modality == int(m)).flatten()
        for m in (modeling.Modality.VIDEO, modeling.Modality.AUDIO, modeling.Modality.TEXT)
    ]
    hidden = model.pre_adapter(x, *idx)
    if time_tokens.shape[-1] > 0:
        hidden[:, : time_tokens.shape[-1]] = time_tokens.to(hidden.dtype)
    return BlockInput(hidden, model.pre_adapter.rope(coords), varlen, _mod("layers").ModalityDispatcher(modality, 3))


def peak_gib(fn: Callable[[], object], dev: str) -> dict[str, float] | None:
    if dev == "cpu":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return {
        "peak_gib": round(peak / GIB, 3),
        "resident_gib": round(base / GIB, 3),
        "activation_gib": round((peak - base) / GIB, 3),
    }


def dynamo_counters() -> dict[str, Any]:
    from torch._dynamo.utils import counters

    return {
        group: dict(values)
        for group, values in counters.items()
        if group in ("stats", "graph_break", "recompiles", "unimplemented", "frames")
    }


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# -- the run -----------------------------------------------------------------------------------------


class Report:
    """The result file, written again after every record (a run cut short keeps what it measured)."""

    def __init__(self, out: Path, head: dict[str, Any]) -> None:
        self.out, self.data = out, {**head, "results": [], "breakdown": [], "errors": []}

    def add(self, kind: str, record: dict[str, Any]) -> None:
        self.data[kind].append(record)
        self.out.write_text(json.dumps(self.data, indent=1))

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.out.write_text(json.dumps(self.data, indent=1))


def _record_times(
    report: Report,
    form: str,
    mode: str,
    fns: dict[str, Callable[[], object]],
    iters: int,
    dev: str,
    *,
    per: int = 1,
    **extra: Any,
) -> None:
    """Time the plugin-off and plugin-on calls alternating; one record each, in seconds per step
    (``per``: calls per step divide the time, for per-layer figures)."""
    times = time_alternating(fns, iters, warmup=1, device=dev)
    for plugin, ms in times.items():
        report.add(
            "results",
            {
                "form": form,
                "mode": mode,
                "plugin": plugin,
                **extra,
                "s_per_step": stats([t / 1e3 / per for t in ms]),
                "samples_ms": ms,
            },
        )
    if len(times) < 2:  # one plugin could not run this form (a capture failed): no ratio
        print(
            f"{form:>15} {mode:>8}: " + ", ".join(f"{k} {stats(v)['p50'] / 1e3 / per:.4f} s" for k, v in times.items())
        )
        return
    off, on = (stats(times[k])["p50"] for k in ("off", "on"))
    print(
        f"{form:>15} {mode:>8}: off {off / 1e3 / per:.4f} s, on {on / 1e3 / per:.4f} s, speed-up {off / on:.2f}x",
        flush=True,
    )


def _modes(
    off: Variant,
    on: Variant,
    packed: Any,
    binput: BlockInput,
    report: Report,
    *,
    modes: Sequence[str],
    iters: int,
    dev: str,
    smoke: bool,
    widths: GemmWidths,
) -> None:
    compile_args = SMOKE_COMPILE if smoke else GPU_COMPILE
    compiled = False
    for mode in in_run_order(modes, MODES):
        if mode in ("compiled", "graph") and not compiled:
            torch._dynamo.reset()
            for v in (off, on):
                v.model.compile_regions(**compile_args)
            for name, v in (("off", off), ("on", on)):
                t0 = time.perf_counter()
                forward_fn(v, packed)()
                block_fn(v, packed, binput)()
                if dev != "cpu":
                    torch.cuda.synchronize()
                report.add(
                    "results",
                    {
                        "form": "compile",
                        "mode": "compiled",
                        "plugin": name,
                        "first_call_s": round(time.perf_counter() - t0, 2),
                    },
                )
            report.put("dynamo_counters", dynamo_counters())
            compiled = True
        fwd = {"off": forward_fn(off, packed), "on": forward_fn(on, packed)}
        blk = {"off": block_fn(off, packed, binput), "on": block_fn(on, packed, binput)}
        if mode == "graph":
            blk = _captured(blk, report, dev)
        else:
            want, got = fwd["off"](), fwd["on"]()
            report.add(
                "results",
                {
                    "form": "check",
                    "mode": mode,
                    "finite": bool(torch.isfinite(want).all() and torch.isfinite(got).all()),
                    "rel_l2_on_vs_off": rel_l2(got, want),
                },
            )
        if iters and mode != "graph":
            _record_times(report, "forward", mode, dict(fwd), iters, dev)
        if iters and mode != "eager" and blk:
            _record_times(report, "block", mode, dict(blk), iters, dev)
        for plugin, fn in (blk if mode == "graph" else fwd).items():
            memory = peak_gib(fn, dev)
            if memory:
                report.add("results", {"form": "memory", "mode": mode, "plugin": plugin, **memory})
            if mode != "graph" and dev != "cpu":
                rows = breakdown(profile_call(fn), widths)
                report.add("breakdown", {"form": "forward", "mode": mode, "plugin": plugin, **rows})


def _captured(fns: dict[str, Callable[[], object]], report: Report, dev: str) -> dict[str, Callable[[], object]]:
    """Each call captured in one CUDA graph; one that cannot be captured is recorded with where it failed."""
    out = {}
    for plugin, fn in fns.items():
        try:
            out[plugin] = graphed(fn, dev)
        except Exception as exc:  # a model that cannot be captured is a result
            frames = [
                f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.name}" for f in traceback.extract_tb(exc.__traceback__)
            ]
            report.add(
                "errors",
                {
                    "form": "block",
                    "mode": "graph",
                    "plugin": plugin,
                    "error": f"{type(exc).__name__}: {exc}"[:1000],
                    "where": frames[-8:],
                },
            )
            print(
                f"graph capture failed (plugin {plugin}): {type(exc).__name__}: {str(exc)[:200]} at {frames[-3:]}",
                flush=True,
            )
            if dev != "cpu":
                torch.cuda.synchronize()
    return out


# -- fidelity ----------------------------------------------------------------------------------------

EXACT = {"attention": "reference", "moe": "reference", "rmsnorm": "reference"}


def fidelity_shape(smoke: bool) -> StepShape:
    """A short clip at the release's channel counts (the FP32 oracle's attention is quadratic in memory)."""
    if smoke:
        return StepShape(video=(1, 4, 2, 2, 4), audio=(1, 4, 4), text_tokens=4, text_channels=8)
    return StepShape(video=(1, 48, 4, 8, 14), audio=(1, 20, 64), text_tokens=32, text_channels=5120)


def build_oracle(cfg: Any, off: nn.Module, dev: str) -> nn.Module:
    """The plugin-on model in FP32 with ``off``'s weights (its MoE bank too): every op is run by
    magi2-core's exact reference under :data:`EXACT`, nothing is rounded to BF16."""
    fp32 = dataclasses.replace(cfg, params_dtype=torch.float32)
    with torch.device("meta"):
        oracle = _mod("modeling_magi2").Magi2PreviewTransformer(fp32)
    src = _moe_modules(off)
    banks = [tuple(nn.Parameter(getattr(src[0], n).detach().float(), requires_grad=False) for n in BANK_NAMES)]
    materialize(oracle, dev, banks if src else [])
    with torch.no_grad():
        theirs = dict(off.named_parameters(remove_duplicate=False))
        for name, p in oracle.named_parameters(remove_duplicate=False):
            if name.rsplit(".", 1)[-1] not in BANK_NAMES:
                p.copy_(theirs[name])
    with m2.use(**EXACT):
        share_prepared_layouts(oracle)
    return oracle.eval().requires_grad_(False)


def _capture_moe_inputs(model: nn.Module) -> tuple[dict[int, torch.Tensor], list[Any]]:
    seen: dict[int, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(model.block.layers):
        if hasattr(layer.mlp, "moe_mlp"):
            hooks.append(layer.mlp.moe_mlp.register_forward_pre_hook(lambda _m, a, i=i: seen.__setitem__(i, a[0])))
    return seen, hooks


def _routes(moe: nn.Module, x: torch.Tensor, theirs: bool) -> torch.Tensor:
    """The sorted expert ids ``[H, T, K]`` that ``moe`` picks for its input ``x [T, H·d]``."""
    heads = x.reshape(x.shape[0], moe.num_heads, moe.d_head)
    if theirs:
        idx = moe._route(heads)[1]
    else:
        bias = moe.router.expert_bias_ema
        idx = m2.moe_route(heads, moe.gate.float(), bias.float(), top_k=moe.top_k, route_scale=4.9)[1]
    return idx.sort(dim=-1).values


def _flip_share(idx: torch.Tensor, ref: torch.Tensor) -> float:
    return float((idx != ref).any(dim=-1).float().mean())


def fidelity(report: Report, off: Variant, on: Variant, cfg: Any, dev: str, smoke: bool) -> None:
    """Per layer, on one input: plugin off's and plugin on's error against the FP32 oracle.

    Every layer gets the oracle's own stream rounded to BF16, so the three results start from the
    same input; the error is the relative L2 of the layer's increment (output minus input). A route
    flip is a (token, head) whose expert set differs from the oracle's. A flip moves its token by a
    whole expert, so each error is also given on the clean tokens: those whose every head routes as
    the oracle does in both plugin off and on (all tokens of a dense layer), where only rounding
    differs."""
    packed = step_input(fidelity_shape(smoke), dev)
    oracle = Variant(build_oracle(cfg, off.model, dev), on.attention)
    binput = block_input(off.model, packed, dev)
    x = binput.dispatcher.permute(binput.hidden)
    args = (binput.rope, binput.varlen, binput.dispatcher, [x.shape[0]])
    captures = {name: _capture_moe_inputs(v.model) for name, v in (("off", off), ("on", on), ("oracle", oracle))}
    rows = []
    for i, layers in enumerate(
        zip(off.model.block.layers, on.model.block.layers, oracle.model.block.layers, strict=True)
    ):
        outs = {}
        for (name, v), layer in zip((("off", off), ("on", on), ("oracle", oracle)), layers, strict=True):
            v.use()
            with m2.use(**EXACT) if name == "oracle" else contextlib.nullcontext():
                outs[name] = layer(x.float() if name == "oracle" else x, *args)
        increment = outs["oracle"].double() - x.double()
        row: dict[str, Any] = {"layer": i, "moe": hasattr(layers[0].mlp, "moe_mlp")}
        for name in ("off", "on"):
            row[f"{name}_rel_err"] = float((outs[name].double() - outs["oracle"].double()).norm() / increment.norm())
        clean = torch.ones(x.shape[0], dtype=torch.bool, device=x.device)
        if row["moe"]:
            with m2.use(**EXACT):
                ref = _routes(layers[2].mlp.moe_mlp, captures["oracle"][0][i], theirs=False)
            off_idx = _routes(layers[0].mlp.moe_mlp, captures["off"][0][i], True)
            on_idx = _routes(layers[1].mlp.moe_mlp, captures["on"][0][i], False)
            row["off_route_flips"], row["on_route_flips"] = _flip_share(off_idx, ref), _flip_share(on_idx, ref)
            clean = (off_idx == ref).all(dim=-1).all(dim=0) & (on_idx == ref).all(dim=-1).all(dim=0)
        row["clean_token_share"] = float(clean.double().mean())
        for name in ("off", "on"):  # the tokens both route as the oracle does: rounding alone
            diff = outs[name].double() - outs["oracle"].double()
            row[f"{name}_rel_err_clean"] = float(diff[clean].norm() / increment[clean].norm()) if clean.any() else 0.0
        rows.append(row)
        x = outs["oracle"].to(cfg.params_dtype)
    for _, hooks in captures.values():
        for h in hooks:
            h.remove()
    worse = [r["layer"] for r in rows if r["on_rel_err"] > r["off_rel_err"]]
    worse_clean = [r["layer"] for r in rows if r["on_rel_err_clean"] > r["off_rel_err_clean"]]
    report.put(
        "fidelity",
        {
            "pack": pack_summary(packed),
            "layers": rows,
            "on_worse_than_off_at": worse,
            "on_worse_than_off_on_clean_tokens_at": worse_clean,
            "method": fidelity.__doc__,
        },
    )
    print(
        f"fidelity: {len(rows)} layers; plugin on worse than off at layers {worse}; on the clean tokens at "
        f"{worse_clean}",
        flush=True,
    )
    _free(oracle, binput, x)


def _free(*objs: object) -> None:
    """Collect and return the device's cached blocks (the caller drops its own references first)."""
    del objs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _distinct_banks(
    report: Report, packed: Any, theirs: Callable[..., torch.Tensor], *, iters: int, dev: str, smoke: bool
) -> None:
    """Per-layer time of a 4-MoE-layer stack with 4 banks and with one, plugin off and on."""

    cfg = model_config(smoke, num_layers=4, moe_only=True)
    for banks in (4, 1):
        _time_stack(report, cfg, packed, theirs, banks, iters=iters, dev=dev)
        _free()


def _time_stack(
    report: Report, cfg: Any, packed: Any, theirs: Callable[..., torch.Tensor], banks: int, *, iters: int, dev: str
) -> None:
    from magi2_core.integrations import vllm_omni as integ

    off_m, on_m = build_pair(cfg, dev, banks, seed=60)
    off, on = Variant(off_m, theirs), Variant(on_m, integ.packed_attention_with_sink)
    binput = block_input(off_m, packed, dev)
    fns: dict[str, Callable[[], object]] = {"off": block_fn(off, packed, binput), "on": block_fn(on, packed, binput)}
    _record_times(
        report, "distinct-banks", "eager", fns, iters, dev, per=cfg.num_layers, banks=banks, layers=cfg.num_layers
    )


def _ep4_rank_memory(report: Report, cfg: Any, activation_gib: float | None, dev: str) -> None:
    """Rank 0 of 4-way expert parallelism, plugin on, allocated: every dense weight, 3 of 12 heads' banks
    in each MoE layer (each its own), and a block of the one-GPU step's activation peak."""
    from magi2_core.integrations import vllm_omni as integ
    from magi2_core.integrations.vllm_omni.moe import EPGroup

    integ.register()  # the model's norms and MoE layers are magi2-core's
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    with torch.device("meta"):
        model = _mod("modeling_magi2").Magi2PreviewTransformer(cfg)
        for layer in model.block.layers:
            if hasattr(layer.mlp, "moe_mlp"):
                layer.mlp.moe_mlp = integ.Magi2MultiHeadMoE(
                    layer.mlp.moe_mlp.config, ep_group=EPGroup(world_size=4, rank=0)
                )
    materialize(model, dev, [])
    for moe in _moe_modules(model):
        moe.prepare_weights()
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated() - base
    block = torch.empty(int((activation_gib or 0.0) * GIB), dtype=torch.uint8, device=dev)
    torch.cuda.synchronize()
    total = torch.cuda.memory_allocated() - base
    card_gib = 81559 / 1024  # an 80 GB card (H100 80GB HBM3: 81,559 MiB)
    moe_heads = {m.real_local_heads for m in _moe_modules(model)}
    report.add(
        "results",
        {
            "form": "ep4-rank-memory",
            "mode": "eager",
            "plugin": "on",
            "ep": 4,
            "rank": 0,
            "local_moe_heads": sorted(moe_heads),
            "weights_gib": round(weights / GIB, 3),
            "activation_gib": activation_gib,
            "total_gib": round(total / GIB, 3),
            "card_gib": round(card_gib, 2),
            "spare_gib": round(card_gib - total / GIB, 3),
            "fits": total / GIB < card_gib,
        },
    )
    print(
        f"EP4 rank 0: weights {weights / GIB:.1f} GiB + activations {activation_gib} GiB = {total / GIB:.1f} GiB "
        f"of {card_gib:.1f}",
        flush=True,
    )
    _free(model, block)


def _whole_model(
    report: Report,
    cfg: Any,
    packed: Any,
    theirs: Callable[..., torch.Tensor],
    *,
    banks: int,
    modes: Sequence[str],
    iters: int,
    dev: str,
    smoke: bool,
    check_fidelity: bool,
) -> float | None:
    """Plugin off and on on the whole model: fidelity, then every mode. Returns plugin on's activation
    peak of one eager step (GiB), measured once if no eager mode ran."""
    from benchmarks.vllm_omni_stack import providers
    from magi2_core.integrations import vllm_omni as integ

    off_m, on_m = build_pair(cfg, dev, banks)
    off, on = Variant(off_m, theirs), Variant(on_m, integ.packed_attention_with_sink)
    binput = block_input(off_m, packed, dev)
    report.put("providers", providers(on_m, cfg, binput))
    widths = GemmWidths.of(cfg)
    if check_fidelity:
        fidelity(report, off, on, cfg, dev, smoke)
    _modes(off, on, packed, binput, report, modes=modes, iters=iters, dev=dev, smoke=smoke, widths=widths)
    activation: float | None = next(
        (
            r["activation_gib"]
            for r in report.data["results"]
            if r["form"] == "memory" and r["mode"] == "eager" and r["plugin"] == "on"
        ),
        None,
    )
    if activation is None and dev != "cpu":
        activation = (peak_gib(forward_fn(on, packed), dev) or {}).get("activation_gib")
    return activation


def run(
    source: Path,
    out: Path,
    *,
    banks: int,
    text_tokens: int,
    iters: int,
    modes: Sequence[str],
    smoke: bool,
    distinct: bool,
    ep4: bool,
    check_fidelity: bool,
    activation_gib: float | None = None,
) -> dict[str, Any]:

    dev = "cpu" if smoke else "cuda"
    if not smoke:
        m2.set_strict(True)
    cfg = model_config(smoke)
    packed = step_input(step_shape(smoke, text_tokens), dev)
    theirs = _mod("attention").packed_attention_with_sink
    report = Report(
        out,
        {
            **env_record(dev),
            "magi2_core": m2.__version__,
            "vllm_omni": stubs.VERSION,
            "vllm_omni_from": str(source),
            "config": {
                "layers": cfg.num_layers,
                "multimodal_layers": list(cfg.multimodal_layers),
                "moe_layers": list(cfg.moe.layers),
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
                "moe_banks": banks,
                "smoke": smoke,
            },
            "pack": {
                **pack_summary(packed),
                "text_tokens_assumed": text_tokens,
                "resolution": "272p (256x448)",
                "seconds": 10,
                "cfg_branches": 2,
            },
            "compile_regions": SMOKE_COMPILE if smoke else GPU_COMPILE,
            "method": "one step = one transformer forward over the CFG pack; CUDA events, L2 flushed before each call, "
            "plugin off/on alternating (benchmarks/_common); MoE banks shared round-robin between layers",
        },
    )
    print(f"pack: {report.data['pack']}", flush=True)
    _arithmetic(report, cfg, dev)
    with torch.inference_mode():
        if modes or check_fidelity or (ep4 and activation_gib is None and dev != "cpu"):
            measured = _whole_model(
                report,
                cfg,
                packed,
                theirs,
                banks=banks,
                modes=modes,
                iters=iters,
                dev=dev,
                smoke=smoke,
                check_fidelity=check_fidelity,
            )
            activation_gib = activation_gib if activation_gib is not None else measured
        _free()  # the whole model's two copies are gone with _whole_model's frame
        if ep4 and dev != "cpu":
            _ep4_rank_memory(report, cfg, activation_gib, dev)
        if distinct:
            _distinct_banks(report, packed, theirs, iters=max(iters, 3), dev=dev, smoke=smoke)
    return report.data


def _arithmetic(report: Report, cfg: Any, dev: str) -> None:
    """The step's products per category, and on a GPU its matmul floor at this device's measured rate."""
    work = step_work(cfg, report.data["pack"]["per_sequence"])
    report.put("work", [{"category": w.category, "tflop": w.flops / 1e12, "kind": w.kind} for w in work])
    if dev == "cpu":
        return
    ceilings = measure_ceilings(dev)
    report.put("ceilings", ceilings.record())
    report.put("matmul_floor_s", matmul_floor_s(work, ceilings.matmul_tflops))
    print(
        f"BF16 matmul floor: {report.data['matmul_floor_s']:.3f} s per step at {ceilings.matmul_tflops:.0f} TFLOP/s",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument(
        "--wheel", required=True, type=Path, help="vllm-omni 0.30.0's wheel, or a directory holding vllm_omni/"
    )
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--banks", type=int, default=1, help="distinct MoE banks the 36 MoE layers share (default 1)")
    p.add_argument("--text-tokens", type=int, default=TEXT_TOKENS, help="text tokens per CFG branch")
    p.add_argument("--iters", type=int, help="timed calls per variant (default 5; smoke: 2; 0: profile only)")
    p.add_argument(
        "--modes",
        nargs="*",
        choices=MODES,
        default=list(MODES),
        help="timed modes, run in this order whatever the order given (none: skip timing)",
    )
    p.add_argument("--no-fidelity", action="store_true", help="skip the per-layer check against the FP32 oracle")
    p.add_argument("--no-distinct-banks", action="store_true", help="skip the 4-layer distinct-banks check")
    p.add_argument("--no-ep4", action="store_true", help="skip the EP4 rank-memory allocation")
    p.add_argument("--activation-gib", type=float, help="the EP4 rank's activation block (default: measured)")
    p.add_argument("--smoke", action="store_true", help="tiny configuration on the CPU (checks the script only)")
    a = p.parse_args(argv)
    if not a.smoke and not torch.cuda.is_available():
        p.error("needs a CUDA GPU (or --smoke)")
    if a.banks < 1 or a.text_tokens < 1 or (a.iters is not None and a.iters < 0):
        p.error("--banks and --text-tokens must be >= 1, --iters >= 0")
    iters = (2 if a.smoke else 5) if a.iters is None else a.iters
    from magi2_core.integrations import vllm_omni as integ

    with tempfile.TemporaryDirectory() as tmp:
        root = stubs.unpack(a.wheel, Path(tmp))
        stubs.install(root)
        try:
            report = run(
                a.wheel,
                a.out,
                banks=a.banks,
                text_tokens=a.text_tokens,
                iters=iters,
                modes=a.modes,
                smoke=a.smoke,
                distinct=not a.no_distinct_banks,
                ep4=not a.no_ep4,
                check_fidelity=not a.no_fidelity,
                activation_gib=a.activation_gib,
            )
        finally:
            integ.unregister()
            stubs.uninstall()
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
