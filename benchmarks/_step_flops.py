"""The arithmetic of one MAGI-2 DiT step, counted from the model's configuration and the pack.

Every matrix product vllm-omni 0.30.0's ``Magi2PreviewTransformer`` runs in one forward, as FLOP
(one multiply-add = 2), sorted into the categories of the profiler breakdown (``benchmarks/_breakdown.py``)
so that each category's kernel time sits beside the work it did. Grouped (per-modality) linears send
each token through one group, so they cost ``2 · tokens · in · out`` whatever the modality split.

The BF16 tensor-core work (attention, the routed experts, the dense and shared-expert GEMMs, the
attention gate) divided by the device's measured BF16 matmul rate is the step's **matmul floor**: no
step on that device runs faster than its BF16 products would at that rate, before any of its FP32
products (the router logits, the mHC projections, the adapters), its memory-bound work (norms, mHC
mixing, RoPE, gathers) or a launch is counted. A floor, not a prediction.

``tests/integrations/test_dit_step_bench.py`` checks the count against torch's FLOP counter over
vllm-omni's own model on the CPU, category by category, for two small configurations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Work", "matmul_floor_s", "step_work"]

Kind = Literal["bf16", "fp32", "mixing"]


@dataclass(frozen=True)
class Work:
    """One category's products: FLOP and the arithmetic they run in."""

    category: str  # a breakdown category (benchmarks/_breakdown.py)
    flops: float
    kind: Kind  # bf16: tensor-core products; fp32: FP32 products; mixing: the mHC stream products


def _dense_intermediate(cfg: Any) -> int:
    """The multimodal layers' MLP width, as vllm-omni's ``Magi2MLP`` derives it."""
    width = int(cfg.hidden_size * cfg.intermediate_factor * 2 / 3) // 128 * 128
    return width or max(1, int(cfg.hidden_size * cfg.intermediate_factor * 2 / 3))


def step_work(cfg: Any, per_sequence: Sequence[Mapping[str, int]]) -> list[Work]:
    """The products of one forward of ``cfg``'s model over a pack of ``per_sequence`` sequences, each
    ``{"video": n, "audio": n, "text": n, "total": n}`` tokens (``dit_step.pack_summary``)."""
    t = sum(s["total"] for s in per_sequence)
    video = sum(s["video"] for s in per_sequence)
    audio = sum(s["audio"] for s in per_sequence)
    text = sum(s["text"] for s in per_sequence)
    h, hq, hkv, d = cfg.hidden_size, cfg.num_heads_q, cfg.num_heads_kv, cfg.head_dim
    layers = cfg.num_layers
    moe_layers = len(cfg.moe.layers)
    dense_layers = len(cfg.multimodal_layers)
    s = cfg.mhc.num_streams
    moe = cfg.moe
    d_head = h // moe.num_heads
    routes = t * moe.num_heads * moe.top_k
    inter = _dense_intermediate(cfg)
    sq = sum(x["total"] ** 2 for x in per_sequence)
    shared = moe.shared_expert_intermediate_size + moe.modality_shared_expert_intermediate_size
    # Embedders in, the video and audio output linears out, all at the S·hidden adapter width.
    adapter_io = video * cfg.video_in_channels * 2 + audio * cfg.audio_in_channels * 2 + text * cfg.text_in_channels
    return [
        # Q·Kᵀ and P·V over each sequence, no mask: 2 products of 2·L²·D per head.
        Work("attention", layers * 4.0 * sq * hq * d, "bf16"),
        # Each route: gate and up (d_head -> 2·I), down (I -> d_head).
        Work("routed experts", moe_layers * 2.0 * routes * 3 * d_head * moe.expert_intermediate_size, "bf16"),
        Work(
            "dense GEMMs",
            # q, k, v and the output projection in every layer; split and merge around the experts;
            # the multimodal layers' MLP (up-gate to 2·I, down).
            2.0 * t * h * (layers * ((hq + 2 * hkv) * d + hq * d) + moe_layers * 2 * h + dense_layers * 3 * inter),
            "bf16",
        ),
        Work("attention gate projection", layers * 2.0 * t * h * hq, "bf16"),
        # The shared and the modality-specific shared experts: up-gate to 2·I, down.
        Work("shared experts", moe_layers * 2.0 * t * h * 3 * shared, "bf16"),
        # One logit per (head, expert) from the head's d_head slice, against an FP32 gate.
        Work("route", moe_layers * 2.0 * t * moe.num_heads * moe.num_experts * d_head, "fp32"),
        # Two per layer: the S·hidden stream width to S pre, S post and S x S residual logits.
        Work("mHC projection", layers * 2 * 2.0 * t * s * h * (2 * s + s * s), "fp32"),
        Work("adapters", 2.0 * s * h * adapter_io, "fp32"),
        # Two per layer each: the branch input (S streams summed per token) and the S x S residual mix.
        Work("mHC stream sums", layers * 2 * 2.0 * t * s * h * (1 + s), "mixing"),
    ]


def matmul_floor_s(work: Sequence[Work], matmul_tflops: float) -> float:
    """Seconds the BF16 products of ``work`` take at ``matmul_tflops`` (the measured ceiling)."""
    return sum(w.flops for w in work if w.kind == "bf16") / (matmul_tflops * 1e12)
