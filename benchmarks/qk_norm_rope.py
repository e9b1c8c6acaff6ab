"""Fused ``qk_norm_rope`` (Triton) vs vllm-omni 0.30.0's own form, eager and compiled, for q and k.

    python -m benchmarks.qk_norm_rope [--iters N] [--tokens T] [--json PATH] [--smoke]

The q/k tail of one attention's ``project`` at the 272p / 10 s CFG pack (29,912 tokens, 24 heads of 128,
96 rotated dims, BF16, 3 modalities, tokens interleaved so ``inverse_permute`` is a real gather): q and k
read in place from a packed ``[T, 3·24·128]`` projection. The native form is the ``torch_native``
provider's code (operators.md §6: FP32 norm, ``index_select``, ``apply_rotary_emb``, cast), eager and
under ``torch.compile`` (what ``compile_regions`` makes of it with the plugin off). All variants
alternate call by call, each after an L2 flush, timed with CUDA events (``benchmarks/_common.py``).
Bandwidth is on the minimum bytes (q and k read once and written once in BF16, the angles and the
index read once), also as a fraction of this device's copy bandwidth measured in the same run. Before
timing, the fused result is judged against the float64 reference by the contract's rule (§6.2).
``--smoke`` runs a tiny pack on the CPU under the Triton interpreter (no ceilings, no fractions): it keeps
the script working where there is no GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from magi2_backend_reference.torch_qk_norm_rope import torch_qk_norm_rope

import magi2_core as m2
from benchmarks._fused_op import main, record, time_variants
from magi2_core.contracts import acceptance as acc
from magi2_core.testing import call_record

HEADS, HEAD_DIM, ROTARY = 24, 128, 96
PACK_TOKENS = 29912


def _sizes(t: int) -> list[int]:
    """Video, audio and text groups of a pack (video-dominant, as the 272p / 10 s pack)."""
    audio, text = t // 60, t // 40
    return [t - audio - text, audio, text]


def bench(t: int, iters: int, device: str = "cuda") -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    sizes = _sizes(t)
    modality = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])[torch.randperm(t, generator=g)]
    index = torch.argsort(torch.argsort(modality, stable=True)).to(device)  # vllm-omni's inv_permute_mapping
    qkv = torch.randn(t, 3 * HEADS * HEAD_DIM, generator=g).to(torch.bfloat16).to(device)
    views = [qkv[:, i * HEADS * HEAD_DIM : (i + 1) * HEADS * HEAD_DIM].view(t, HEADS, HEAD_DIM) for i in (0, 1)]
    weights = [(0.2 * torch.randn(len(sizes), HEAD_DIM, generator=g)).to(device) for _ in (0, 1)]
    angles = 3 * torch.randn(t, ROTARY // 2, generator=g)
    rope = torch.cat((angles.sin(), angles.cos()), dim=-1).to(device)
    kw: dict[str, Any] = {"modality_sizes": sizes, "index": index}
    calls = [call_record("qk_norm_rope", x, w, rope, **kw) for x, w in zip(views, weights, strict=True)]

    verdicts = []
    for which, (x, w), call in zip("qk", zip(views, weights, strict=True), calls, strict=True):
        got = m2.qk_norm_rope(x, w, rope, provider="triton", **kw)
        ref = m2.qk_norm_rope(x, w, rope, provider="reference", **kw)
        verdicts.append(f"{which}: {acc.accept_qk_norm_rope(got, ref, call)}")
        del got, ref

    def fused() -> object:
        return [m2.qk_norm_rope(x, w, rope, provider="triton", **kw) for x, w in zip(views, weights, strict=True)]

    compiled = torch.compile(torch_qk_norm_rope.__call__)
    fns: dict[str, Callable[[], object]] = {
        "fused_triton": fused,
        "native_eager": lambda: [torch_qk_norm_rope(c) for c in calls],
        "native_compiled": lambda: [compiled(c) for c in calls],
    }
    minimum = 2 * (2 * t * HEADS * HEAD_DIM * 2) + rope.numel() * 4 + index.numel() * 8
    results = time_variants(fns, iters, minimum, device)
    return record(t, sizes, minimum, verdicts, results, heads=HEADS, head_dim=HEAD_DIM, rotary_dim=ROTARY)


if __name__ == "__main__":
    main("qk_norm_rope", __doc__ or "", bench, PACK_TOKENS)
