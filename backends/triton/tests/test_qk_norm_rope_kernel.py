"""Fused ``qk_norm_rope`` kernel against the float64 reference, under ``TRITON_INTERPRET=1`` on the CPU (on
CUDA when present): the conformance kit on a fresh seed, strided views, more modality groups than one
launch serves, sources outside the tokens, the single cast, and vllm-omni's own form on a GPU."""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import magi2_core as m2
from magi2_core.contracts import acceptance as acc
from magi2_core.testing import call_record, run_kit

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
gpu = pytest.mark.gpu


def _inputs(
    seed: int, t: int, h: int, d: int, r: int, m: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, h, d, generator=g) * torch.exp(torch.randn(t, h, 1, generator=g))).to(dtype)
    w = 0.2 * torch.randn(m, d, generator=g)
    angles = 3 * torch.randn(t, r // 2, generator=g)
    rope = torch.cat((angles.sin(), angles.cos()), dim=-1)
    index = torch.randperm(t, generator=g)
    return tuple(a.to(DEVICE) for a in (x, w, rope, index))  # type: ignore[return-value]


def _check(args: tuple[torch.Tensor, ...], **kw: object) -> None:
    got = m2.qk_norm_rope(*args[:3], provider="triton", **kw)  # type: ignore[arg-type]
    ref = m2.qk_norm_rope(*args[:3], provider="reference", **kw)  # type: ignore[arg-type]
    assert got.is_contiguous() and got.dtype == ref.dtype and got.shape == ref.shape
    verdict = acc.accept_qk_norm_rope(got.cpu(), ref.cpu(), call_record("qk_norm_rope", *args[:3], **kw))
    assert verdict, str(verdict)


def test_the_kit_passes_on_a_fresh_seed() -> None:
    seed = random.SystemRandom().randrange(2**31)
    report = run_kit(["triton"], ops=["qk_norm_rope"], devices=[DEVICE], seed=seed)
    assert report.ok, f"seed {seed}:\n{report.format()}"
    assert len(report.results) > 60


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_q_and_k_read_in_place_from_the_packed_projection(dtype: torch.dtype) -> None:
    x, w, rope, index = _inputs(5, 23, 2, 32, 24, 3, dtype)
    packed = torch.randn(23, 3 * 2 * 32, device=DEVICE).to(dtype)  # [q | k | v], as upstream's linear_qkv
    packed[:, 64:128] = x.reshape(23, 64)
    k = packed[:, 64:128].view(23, 2, 32)
    assert not k.is_contiguous()
    _check((k, w, rope, index), modality_sizes=[10, 6, 7], index=index)
    strided_rope = torch.randn(23, 40, device=DEVICE)[:, :24]  # a column view of a wider table
    strided_rope.copy_(rope)
    _check((k, w, strided_rope, index), modality_sizes=[10, 6, 7], index=index, out_dtype=torch.float32)


def test_more_modality_groups_than_one_launch_serves() -> None:
    sizes = [3, 0, 2, 0, 4, 1, 5]  # seven groups, two empty: two launches, rows gathered across both
    x, _, rope, index = _inputs(7, sum(sizes), 2, 16, 16, 1, torch.bfloat16)
    w = 0.3 * torch.randn(len(sizes), 16, device=DEVICE)
    _check((x, w, rope, index), modality_sizes=sizes, index=index)
    _check((x, w, rope, index), modality_sizes=sizes)


def test_a_source_outside_the_tokens_gives_a_nan_row_and_is_never_read() -> None:
    x, w, rope, index = _inputs(9, 6, 2, 16, 8, 1, torch.float32)
    index = index.clone()
    index[1], index[4] = -1, 6
    y = m2.qk_norm_rope(x, w, rope, index=index, provider="triton").cpu()
    assert y[[1, 4]].isnan().all()
    ok = [0, 2, 3, 5]
    good = m2.qk_norm_rope(x, w, rope, index=index.clamp(0, 5), provider="triton").cpu()
    assert torch.equal(y[ok], good[ok])


@pytest.mark.parametrize("out", [torch.bfloat16, torch.float16])
def test_the_output_is_the_fp32_result_cast_once(out: torch.dtype) -> None:
    x, w, rope, index = _inputs(13, 40, 3, 64, 48, 3, torch.bfloat16)
    kw = {"modality_sizes": [20, 8, 12], "index": index}
    y32 = m2.qk_norm_rope(x, w, rope, out_dtype=torch.float32, provider="triton", **kw)
    y = m2.qk_norm_rope(x, w, rope, out_dtype=out, provider="triton", **kw)
    assert torch.equal(y.cpu(), y32.cpu().to(out))


@gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (not the interpreter)")
def test_the_release_shape_meets_the_contract_and_agrees_with_vllm_omnis_form() -> None:
    """MAGI-2's q at a pack's size: 24 heads of 128, 96 rotated dims, three modalities, the inverse
    permutation; against float64, and by the same rule against upstream's FP32 chain (torch_native) as
    the reference. (Not "within one BF16 ULP of upstream": where the two products of a rotation nearly
    cancel, an FMA and upstream's separate roundings differ by more, as the H100 showed at e886b01.)"""
    sizes = [7168, 125, 185]
    x, w, rope, index = _inputs(17, sum(sizes), 24, 128, 96, 3, torch.bfloat16)
    kw = {"modality_sizes": sizes, "index": index}
    _check((x, w, rope, index), **kw)
    got = m2.qk_norm_rope(x, w, rope, provider="triton", **kw)
    native = m2.qk_norm_rope(x, w, rope, provider="torch_native", **kw)
    verdict = acc.accept_qk_norm_rope(got, native, call_record("qk_norm_rope", x, w, rope, **kw))
    assert verdict, str(verdict)
    assert torch.equal(got, m2.qk_norm_rope(x, w, rope, provider="triton", **kw))  # repeatable
