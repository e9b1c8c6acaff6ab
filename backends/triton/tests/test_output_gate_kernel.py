"""Fused ``output_gate`` kernel against the float64 reference, under ``TRITON_INTERPRET=1`` on the CPU (on
CUDA when present): the conformance kit on a fresh seed, strided views, sources outside the tokens, the
single cast, and the product as upstream's compiled form computes it on a GPU."""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import magi2_core as m2
from magi2_core.contracts import acceptance as acc
from magi2_core.testing import run_kit

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
gpu = pytest.mark.gpu


def _inputs(seed: int, t: int, h: int, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, d, generator=g).to(dtype)
    gate = (3 * torch.randn(t, h, 1, generator=g)).to(dtype)
    index = torch.randperm(t, generator=g)
    return x.to(DEVICE), gate.to(DEVICE), index.to(DEVICE)


def _check(x: torch.Tensor, gate: torch.Tensor, **kw: object) -> torch.Tensor:
    got = m2.output_gate(x, gate, provider="triton", **kw)  # type: ignore[arg-type]
    ref = m2.output_gate(x, gate, provider="reference", **kw)  # type: ignore[arg-type]
    assert got.is_contiguous() and got.dtype == ref.dtype and got.shape == ref.shape
    verdict = acc.accept_output_gate(got.cpu(), ref.cpu(), gate)
    assert verdict, str(verdict)
    return got


def test_the_kit_passes_on_a_fresh_seed() -> None:
    seed = random.SystemRandom().randrange(2**31)
    report = run_kit(["triton"], ops=["output_gate"], devices=[DEVICE], seed=seed)
    assert report.ok, f"seed {seed}:\n{report.format()}"
    assert len(report.results) > 60


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_strided_x_and_a_gate_read_from_a_wider_projection(dtype: torch.dtype) -> None:
    x, gate, index = _inputs(5, 23, 3, 32, dtype)
    wide = torch.randn(23, 6, 32, device=DEVICE).to(dtype)
    wide[:, ::2] = x
    strided = wide[:, ::2]
    proj = torch.randn(23, 3 + 7, device=DEVICE).to(dtype)  # the logits as columns of a wider output
    proj[:, 7:] = gate[..., 0]
    assert not strided.is_contiguous() and not proj[:, 7:].is_contiguous()
    y = _check(strided, proj[:, 7:], index=index)
    assert torch.equal(y, m2.output_gate(x, gate, index=index, provider="triton"))


def test_a_source_outside_the_tokens_gives_a_nan_row_and_is_never_read() -> None:
    x, gate, index = _inputs(9, 6, 2, 16, torch.float32)
    index = index.clone()
    index[1], index[4] = -1, 6
    y = m2.output_gate(x, gate, index=index, provider="triton").cpu()
    assert y[[1, 4]].isnan().all()
    ok = [0, 2, 3, 5]
    good = m2.output_gate(x, gate, index=index.clamp(0, 5), provider="triton").cpu()
    assert torch.equal(y[ok], good[ok])


@pytest.mark.parametrize("out", [torch.bfloat16, torch.float16])
def test_the_output_is_the_fp32_result_cast_once(out: torch.dtype) -> None:
    x, gate, index = _inputs(13, 40, 3, 64, torch.bfloat16)
    y32 = m2.output_gate(x, gate, index=index, out_dtype=torch.float32, provider="triton")
    y = m2.output_gate(x, gate, index=index, out_dtype=out, provider="triton")
    assert torch.equal(y.cpu(), y32.cpu().to(out))


@gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (not the interpreter)")
def test_the_release_shape_meets_the_contract_and_agrees_with_the_compiled_form() -> None:
    """MAGI-2's attention output at the 272p / 10 s pack (29,912 tokens, 24 heads of 128) and the
    modality permutation: against float64, and against torch's FP32 form (vllm-omni's product as
    inductor computes it) by the same rule."""
    x, gate, index = _inputs(17, 29912, 24, 128, torch.bfloat16)
    got = _check(x, gate, index=index)
    native = m2.output_gate(x, gate, index=index, provider="torch_native")
    verdict = acc.accept_output_gate(got, native, gate)
    assert verdict, str(verdict)
    assert torch.equal(got, m2.output_gate(x, gate, index=index, provider="triton"))  # repeatable
