"""Fused mHC (Triton ``mhc_pre`` + ``mhc_mix``) vs vllm-omni 0.30.0's native form, eager and compiled.

    python -m benchmarks.mhc [--iters N] [--tokens T] [--json PATH] [--wheel VLLM_OMNI_WHEEL_OR_DIR] [--smoke]

One branch's mHC at the 272p / 10 s CFG pack (29,912 tokens, 4 streams of 3072, BF16, 3 modalities):
``mhc_pre`` then ``mhc_mix`` (the branch itself is left out: its output is a fixed tensor). The native
form is the ``torch_native`` provider's code (operators.md §5: FP32 norm written out, FP32 GEMM,
sigmoid, einsums, Sinkhorn), eager and under ``torch.compile``. With ``--wheel``, vllm-omni's own
path runs too: one real ``Magi2TransformerLayer`` of the released config (vLLM stubbed,
``benchmarks/_vllm_stubs.py``) with the same mHC parameters, its ``_branch_logits``,
``_branch_input`` and ``_connect`` eager (its Triton Sinkhorn and mix kernels) and compiled as
vllm-omni's pipeline compiles (``fullgraph=True, dynamic=True``: its native path). All variants alternate call by call,
each after an L2 flush, timed with CUDA events (``benchmarks/_common.py``). Bandwidth is reported
on two byte counts: what the fused design moves (the streams read twice by ``mhc_pre`` and once by
``mhc_mix``, the branch input and the new streams written, the branch output read) and the minimum
(the streams read once by each op), each also as a fraction of this device's copy bandwidth, measured
in the same run (``_common.measure_ceilings``, recorded under ``env.ceilings``). Before timing, the
fused outputs are judged against the float64 reference by the contract's rules (operators.md §5.4).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from magi2_backend_reference.torch_mhc import torch_mhc_mix, torch_mhc_pre

import magi2_core as m2
from benchmarks._fused_op import main, record, time_variants
from magi2_core.contracts import acceptance as acc
from magi2_core.testing import call_record
from magi2_core.testing.op_cases.mhc_pre import mhc_parameters, mhc_streams

STREAMS, WIDTH = 4, 3072
PACK_TOKENS = 29912


def _sizes(t: int) -> list[int]:
    """Video, audio and text groups of a pack (video-dominant, as the 272p / 10 s pack)."""
    audio, text = t // 9, t // 40
    return [t - audio - text, audio, text]


def vllm_omni_variants(
    root: Path, x: torch.Tensor, params: tuple[torch.Tensor, ...], sizes: list[int], y: torch.Tensor
) -> dict[str, Callable[[], object]]:
    """vllm-omni's own mHC of one branch on a real layer holding ``params``: eager and compiled."""
    from benchmarks import _vllm_stubs as stubs
    from benchmarks.dit_step import model_config
    from benchmarks.vllm_omni_stack import GPU_COMPILE, _mod

    stubs.install(stubs.unpack(root, Path(tempfile.mkdtemp())) if root.is_file() else root)
    modeling, layers = _mod("modeling_magi2"), _mod("layers")
    cfg = model_config(False)
    with torch.device("meta"):
        layer = modeling.Magi2TransformerLayer(cfg, cfg.multimodal_layers[0])
    layer.to_empty(device=x.device)
    names = (
        "mhc_norm.weight",
        *(
            f"mhc_{n}_attn"
            for n in ("phi_fused", "alpha_pre", "alpha_post", "alpha_res", "bias_pre", "bias_post", "bias_res")
        ),
    )
    own = dict(layer.named_parameters())
    with torch.no_grad():
        for name, value in zip(names, params, strict=True):
            own[name].copy_(value.view_as(own[name]))
    modality = torch.cat([torch.full((n,), i, device=x.device) for i, n in enumerate(sizes)])
    dispatcher = layers.ModalityDispatcher(modality, len(sizes))
    cls = modeling.Magi2TransformerLayer

    def branch() -> torch.Tensor:
        logits = cls._branch_logits(layer, x, "attn", dispatcher)
        cls._branch_input(layer, x, "attn", logits)
        out: torch.Tensor = cls._connect(layer, x, y, "attn", logits)
        return out

    compiled = torch.compile(branch, **GPU_COMPILE)
    return {"vllm_omni_eager": branch, "vllm_omni_compiled": compiled}


def bench(t: int, iters: int, device: str = "cuda", wheel: Path | None = None) -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    sizes = _sizes(t)
    x = mhc_streams(g, t, STREAMS, WIDTH, torch.bfloat16).to(device)
    params = tuple(p.to(device) for p in mhc_parameters(g, len(sizes), STREAMS, WIDTH))
    y = torch.randn(t, WIDTH, generator=g).to(torch.bfloat16).to(device)

    def fused() -> torch.Tensor:
        _h, post, res = m2.mhc_pre(x, *params, modality_sizes=sizes, provider="triton")
        return m2.mhc_mix(x, y, post, res, provider="triton")

    pre_call = call_record("mhc_pre", x, *params, modality_sizes=sizes)

    def native(pre: Callable[[Any], Any] = torch_mhc_pre, mix: Callable[[Any], Any] = torch_mhc_mix) -> torch.Tensor:
        _h, post, res = pre(pre_call)
        return mix(call_record("mhc_mix", x, y, post, res))

    pre_c, mix_c = torch.compile(torch_mhc_pre), torch.compile(torch_mhc_mix)

    verdicts: list[str] = []
    got = m2.mhc_pre(x, *params, modality_sizes=sizes, provider="triton")
    ref = m2.mhc_pre(x, *params, modality_sizes=sizes, provider="reference")
    verdicts += [
        str(acc.accept_mhc_branch_input(got[0], ref[0], x)),
        str(acc.accept_mhc_coefficients(got[1], ref[1], "post")),
        str(acc.accept_mhc_coefficients(got[2], ref[2], "residual")),
    ]
    mix_call = call_record("mhc_mix", x, y, ref[1], ref[2])
    mixed = m2.mhc_mix(x, y, ref[1], ref[2], provider="triton")
    verdicts.append(str(acc.accept_mhc_mix(mixed, m2.mhc_mix(x, y, ref[1], ref[2], provider="reference"), mix_call)))
    del got, ref, mixed

    s = x.numel() * 2
    design = 3 * s + s + 2 * y.numel() * 2  # pre reads twice, mix reads once and writes; h written, y read
    minimum = 2 * s + s + 2 * y.numel() * 2
    fns: dict[str, Callable[[], object]] = {
        "fused_triton": fused,
        "native_eager": native,
        "native_compiled": lambda: native(pre_c, mix_c),
    }
    if wheel is not None:
        upstream = vllm_omni_variants(wheel, x, params, sizes, y)
        own = acc.accept_mhc_mix(fused(), upstream["vllm_omni_eager"](), mix_call)  # the reference's coefficients
        verdicts.append(f"vllm-omni's own mix vs the fused: {own}")
        fns.update(upstream)
    results = time_variants(fns, iters, minimum, device)
    for r in results.values():
        r["tb_s_design_bytes"] = design / (r["p50_ms"] * 1e-3) / 1e12
    return {**record(t, sizes, minimum, verdicts, results, streams=STREAMS, width=WIDTH), "design_bytes": design}


if __name__ == "__main__":
    main("mhc", __doc__ or "", bench, PACK_TOKENS, wheel=True)
