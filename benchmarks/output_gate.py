"""Fused ``output_gate`` (Triton) vs vllm-omni 0.30.0's own form, eager and compiled.

    python -m benchmarks.output_gate [--iters N] [--tokens T] [--json PATH] [--smoke]

The output gate of one attention's ``output`` at the 272p / 10 s CFG pack (29,912 tokens, 24 heads of 128,
BF16, 3 modalities, tokens interleaved so ``permute`` is a real gather): the attention result's rows
gathered into modality order and each head scaled by ``sigmoid`` of its gate logit. The native form is
upstream's expression (``index_select``, ``* sigmoid(gates)``, reshape, cast), eager, under
``torch.compile`` on static shapes, and under ``torch.compile(dynamic=True)``, as vllm-omni's
``compile_regions`` compiles it with the plugin off (inductor's kernel differs: the step's breakdown
showed the dynamic one about 4x slower). All variants alternate
call by call, each after an L2 flush, timed with CUDA events (``benchmarks/_common.py``). Bandwidth is
on the minimum bytes (the attention output read once and the gated rows written once in BF16, the
logits and the index read once), also as a fraction of this device's copy bandwidth measured in the same
run. Before timing, the fused result is judged against the float64 reference by the contract's rule
(operators.md §7.2). ``--smoke`` runs a tiny pack on the CPU under the Triton interpreter (no ceilings,
no fractions): it keeps the script working where there is no GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import magi2_core as m2
from benchmarks._fused_op import main, record, time_variants
from magi2_core.contracts import acceptance as acc

HEADS, HEAD_DIM = 24, 128
PACK_TOKENS = 29912


def upstream_form(attention: torch.Tensor, gates: torch.Tensor, permute: torch.Tensor) -> torch.Tensor:
    """vllm-omni's ``Magi2Attention.output`` before its projection: gather, gate, reshape, cast."""
    out = attention.index_select(0, permute) * torch.sigmoid(gates)
    return out.reshape(out.shape[0], -1).to(torch.bfloat16)


def bench(t: int, iters: int, device: str = "cuda") -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    audio, text = t // 60, t // 40
    sizes = [t - audio - text, audio, text]
    modality = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])[torch.randperm(t, generator=g)]
    permute = torch.argsort(modality, stable=True).to(device)  # vllm-omni's permute_mapping
    o = torch.randn(t, HEADS, HEAD_DIM, generator=g).to(torch.bfloat16).to(device)
    gates = (3 * torch.randn(t, HEADS, 1, generator=g)).to(torch.bfloat16).to(device)
    got = m2.output_gate(o, gates, index=permute, provider="triton")
    ref = m2.output_gate(o, gates, index=permute, provider="reference")
    theirs = upstream_form(o, gates, permute).view_as(ref)
    verdicts = [f"triton: {acc.accept_output_gate(got, ref, gates)}"]
    verdicts.append(f"upstream eager: {acc.accept_output_gate(theirs, ref, gates)}")
    del got, ref, theirs

    compiled = torch.compile(upstream_form)
    dynamic = torch.compile(upstream_form, dynamic=True)
    fns: dict[str, Callable[[], object]] = {
        "fused_triton": lambda: m2.output_gate(o, gates, index=permute, provider="triton"),
        "native_eager": lambda: upstream_form(o, gates, permute),
        "native_compiled": lambda: compiled(o, gates, permute),
        "native_compiled_dynamic": lambda: dynamic(o, gates, permute),
    }
    minimum = 2 * t * HEADS * HEAD_DIM * 2 + gates.numel() * 2 + permute.numel() * 8
    results = time_variants(fns, iters, minimum, device)
    return record(t, sizes, minimum, verdicts, results, heads=HEADS, head_dim=HEAD_DIM)


if __name__ == "__main__":
    main("output_gate", __doc__ or "", bench, PACK_TOKENS)
