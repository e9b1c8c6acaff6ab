"""The fused ``mhc_mix_pre`` kernel against the float64 reference (operators.md §5.4), under
``TRITON_INTERPRET=1`` on the CPU (on CUDA when present): the conformance kit on a fresh seed, the mix's
own bits in the new streams, launches that split the stream width, more modality groups than one launch
serves, non-finite streams, and (on CUDA) two runs of the release's width bit for bit."""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from magi2_backend_triton.mhc_mix_pre import MIX_PRE, MixPreConfig, launch_mhc_mix_pre

import magi2_core as m2
from magi2_core.ops.mhc_mix_pre import SPEC
from magi2_core.testing import call_record, run_kit
from magi2_core.testing.op_cases.mhc_pre import mhc_parameters, mhc_streams

DEVICE = "cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1" else "cpu"
_OUTPUTS = SPEC.output_names


def _inputs(seed: int, t: int, n: int, d: int, dtype: torch.dtype, m: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = mhc_streams(g, t, n, d, dtype)
    y = torch.randn((t, d), generator=g, dtype=torch.float64).to(dtype)
    post = (2 * torch.rand((t, n), generator=g, dtype=torch.float64)).to(dtype)
    res = torch.softmax(torch.randn((t, n, n), generator=g, dtype=torch.float64), dim=-1).to(dtype)
    return tuple(a.to(DEVICE) for a in (x, y, post, res, *mhc_parameters(g, m, n, d)))


def _verdicts(args: tuple[torch.Tensor, ...], got: tuple[torch.Tensor, ...], **kw: object) -> list[object]:
    cpu = tuple(a.cpu() for a in args)
    ref = m2.mhc_mix_pre(*cpu, provider="reference", **kw)  # type: ignore[arg-type]
    call = call_record("mhc_mix_pre", *cpu, **kw)
    named = dict(zip(_OUTPUTS, (o.cpu() for o in got), strict=True))
    return list(SPEC.accept(None, named, dict(zip(_OUTPUTS, ref, strict=True)), call))


def test_the_kit_passes_on_a_fresh_seed() -> None:
    seed = random.SystemRandom().randrange(2**31)
    report = run_kit(["triton"], ops=["mhc_mix_pre"], devices=[DEVICE], seed=seed)
    assert report.ok, f"seed {seed}:\n{report.format()}"
    assert len(report.results) > 20


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_new_streams_are_the_mix_kernels_bits(dtype: torch.dtype) -> None:
    args = _inputs(3, 29, 4, 48, dtype, 1)
    got = m2.mhc_mix_pre(*args, provider="triton")
    assert torch.equal(got[0], m2.mhc_mix(*args[:4], provider="triton"))
    assert all(_verdicts(args, got))


@pytest.mark.parametrize(
    "config",
    [
        MixPreConfig(block_t=16, block_d=16, num_warps=4, num_stages=1, split_d=1),
        MixPreConfig(block_t=16, block_d=16, num_warps=4, num_stages=1, split_d=3),  # a ragged last chunk
        MixPreConfig(block_t=32, block_d=32, num_warps=4, num_stages=2, split_d=2),
    ],
)
def test_launches_that_split_the_width_pass_and_keep_the_streams(config: MixPreConfig) -> None:
    sizes = [3, 0, 20, 0, 9, 5]  # six groups, two of them empty: two launches of the fused kernel
    args = _inputs(7, sum(sizes), 4, 40, torch.bfloat16, len(sizes))
    kw = {"modality_sizes": sizes, "out_dtype": torch.float32}
    got = launch_mhc_mix_pre(call_record("mhc_mix_pre", *args, **kw), config)  # type: ignore[arg-type]
    verdicts = _verdicts(args, got, **kw)
    assert all(verdicts), [str(v) for v in verdicts]
    assert torch.equal(got[0], m2.mhc_mix(*args[:4], provider="triton"))


def test_nonfinite_streams_spread_as_in_the_reference() -> None:
    args = list(_inputs(5, 19, 3, 32, torch.bfloat16, 1))  # three streams: a padded stream in the tiles
    args[0][2, 1, 5] = float("inf")
    args[0][6, 2, 0] = float("nan")
    got = m2.mhc_mix_pre(*args, provider="triton")
    ref = m2.mhc_mix_pre(*(a.cpu() for a in args), provider="reference")
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a.cpu().isnan(), b.isnan())
    assert got[3][0].isfinite().all()  # a token without a non-finite stream keeps finite coefficients


def test_strided_streams_give_the_contiguous_bits() -> None:
    args = _inputs(9, 21, 4, 32, torch.bfloat16, 1)
    wide = torch.zeros((21, 4, 64), dtype=torch.bfloat16, device=DEVICE)
    wide[..., ::2] = args[0]
    strided = (wide[..., ::2], *args[1:])
    for a, b in zip(m2.mhc_mix_pre(*strided, provider="triton"), m2.mhc_mix_pre(*args, provider="triton"), strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs CUDA: the compiled, pipelined launch at the release's width")
def test_the_release_width_passes_and_repeats_bit_for_bit() -> None:
    sizes = [700, 90, 26]
    args = _inputs(13, sum(sizes), 4, 3072, torch.bfloat16, len(sizes))
    call = call_record("mhc_mix_pre", *args, modality_sizes=sizes)
    for config in (MIX_PRE, MixPreConfig(block_t=128, block_d=32, num_warps=8, num_stages=3, split_d=2)):
        first = launch_mhc_mix_pre(call, config)
        second = launch_mhc_mix_pre(call, config)
        assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True)), config
        verdicts = _verdicts(args, first, modality_sizes=sizes)
        assert all(verdicts), (config, [str(v) for v in verdicts])
