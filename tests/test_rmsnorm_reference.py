"""``magi2_core.rmsnorm`` on CPU (reference provider) against the float64 oracle (operators.md §4).

Contract (§4.4): FP32 output within rtol = atol = 1e-6, BF16/FP16 within one local ULP of the
oracle's value rounded to the output dtype; output dtype ``out_dtype or x.dtype``; inputs untouched.
"""

from __future__ import annotations

import math

import oracles
import pytest
import torch

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_rmsnorm

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(y: torch.Tensor, expected64: torch.Tensor, out_dtype: torch.dtype) -> None:
    assert y.dtype == out_dtype and y.shape == expected64.shape
    verdict = accept_rmsnorm(y, expected64.to(out_dtype))
    assert verdict, str(verdict)
    if out_dtype == torch.float32:
        assert torch.allclose(y.double(), expected64, rtol=1e-6, atol=1e-6, equal_nan=True)
    else:
        off = oracles.ulps_off(y, expected64, ulps=1)
        assert off is None, off


# (M, P, T, heads, modality sizes): upstream #7286's parity grid plus odd sizes and empty groups
CASES = {
    "M1-P1-2d": (1, 1, 7, None, None),
    "M3-P1-heads6": (3, 1, 9, 6, [4, 0, 5]),
    "M3-P4": (3, 4, 7, 4, [2, 3, 2]),
    "M3-P4-empty": (3, 4, 7, 4, [3, 0, 4]),
    "M3-P4-T0": (3, 4, 0, 4, [0, 0, 0]),
    "M2-P1-2d-lastempty": (2, 1, 5, None, [5, 0]),
}


@pytest.mark.parametrize("case", list(CASES), ids=str)
@pytest.mark.parametrize(
    ("dtype", "out_dtype"),
    [
        (torch.float32, None),
        (torch.bfloat16, None),
        (torch.float16, None),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.bfloat16),
    ],
    ids=str,
)
def test_matches_oracle(
    seed: int, make: oracles.MakeTensor, case: str, dtype: torch.dtype, out_dtype: torch.dtype | None
) -> None:
    m, p, t, heads, sizes = CASES[case]
    d = 128 if seed != 17 else 37
    shape = (t, d) if heads is None else (t, heads, d)
    x = make(shape, dtype, scale=3.0, contiguous=seed == 3)  # upstream #7286 feeds [..., ::2] views
    weight = torch.randn(m, p, d) * 0.1
    x0, w0 = x.clone(), weight.clone()
    y = m2.rmsnorm(x, weight, modality_sizes=sizes, out_dtype=out_dtype)
    _check(y, oracles.rmsnorm(x, weight, modality_sizes=sizes), out_dtype or dtype)
    assert torch.equal(x, x0) and torch.equal(weight, w0)


def test_flat_weight_is_modality_major(make: oracles.MakeTensor) -> None:
    m, p, d = 3, 2, 16
    x = make((8, p, d))
    flat = torch.randn(m * p * d) * 0.2
    sizes = [3, 1, 4]
    y = m2.rmsnorm(x, flat, modality_sizes=sizes)
    _check(y, oracles.rmsnorm(x, flat.view(m, p, d), modality_sizes=sizes), torch.float32)
    # each group really gets its own scale: w[m] is flat[(m·P + p)·D + c]
    swapped = flat.view(m, p, d)[[1, 0, 2]].reshape(-1)
    assert not torch.allclose(m2.rmsnorm(x, swapped, modality_sizes=sizes), y)


def test_a_weight_of_one_row_per_modality_is_m_by_d(make: oracles.MakeTensor) -> None:
    """The natural layout [M, D] (modality_sizes of length M) means P = 1: the same as [M, 1, D]."""
    x = make((8, 4, 16))
    weight = torch.randn(3, 16) * 0.2
    sizes = [3, 1, 4]
    y = m2.rmsnorm(x, weight, modality_sizes=sizes)
    assert torch.equal(y, m2.rmsnorm(x, weight.view(3, 1, 16), modality_sizes=sizes))
    _check(y, oracles.rmsnorm(x, weight.view(3, 1, 16), modality_sizes=sizes), torch.float32)
    with pytest.raises(m2.InvalidShapeError, match=r"\[3, 16\] \(P = 1\)"):  # [M, D] of another M: refused
        m2.rmsnorm(x, torch.randn(2, 16), modality_sizes=sizes)


def test_single_pattern_broadcasts_over_heads(make: oracles.MakeTensor) -> None:
    x = make((5, 6, 32), torch.bfloat16)
    weight = torch.randn(1, 1, 32) * 0.3
    y = m2.rmsnorm(x, weight)
    _check(y, oracles.rmsnorm(x, weight), torch.bfloat16)
    for h in range(6):  # each head normalised over its own channels with the same scale row
        assert torch.equal(y[:, h], m2.rmsnorm(x[:, h].contiguous(), weight))


def test_many_leading_dims(make: oracles.MakeTensor) -> None:
    x = make((4, 3, 2, 16), torch.float16)
    weight = torch.randn(2, 2, 16) * 0.2
    y = m2.rmsnorm(x, weight, modality_sizes=[1, 3])
    _check(y, oracles.rmsnorm(x, weight, modality_sizes=[1, 3]), torch.float16)


def test_fp32_output_from_bf16_input_is_not_rounded_to_bf16(make: oracles.MakeTensor) -> None:
    x = make((9, 4, 64), torch.bfloat16)
    weight = torch.randn(1, 4, 64) * 0.1
    y = m2.rmsnorm(x, weight, out_dtype=torch.float32)
    _check(y, oracles.rmsnorm(x, weight), torch.float32)
    assert not torch.equal(y, y.to(torch.bfloat16).float())  # one final cast only, to FP32


@pytest.mark.parametrize("wdtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_weight_rounds_w_plus_one_first(make: oracles.MakeTensor, wdtype: torch.dtype) -> None:
    """Upstream #7286 `test_low_precision_weights_keep_offset_rounding_order`: ``w + 1`` in the weight's dtype."""
    x = make((6, 32))
    weight = (torch.randn(1, 1, 32) * 0.01).to(wdtype)  # 1 + 0.01·n is not representable in 8/11 bits
    y = m2.rmsnorm(x, weight)
    _check(y, oracles.rmsnorm(x, weight), torch.float32)
    promoted_first = oracles.rmsnorm(x, weight.float())  # the other order: w + 1 formed in FP32
    assert not torch.allclose(y.double(), promoted_first, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("eps", [1e-6, 1e-5, 0.0, 0.5])
def test_eps(make: oracles.MakeTensor, eps: float) -> None:
    x = make((7, 24), scale=1e-2)  # mean(x²) ~ 1e-4: eps matters
    weight = torch.randn(1, 1, 24) * 0.1
    y = m2.rmsnorm(x, weight, eps=eps)
    _check(y, oracles.rmsnorm(x, weight, eps=eps), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_and_inf_propagate(make: oracles.MakeTensor, dtype: torch.dtype) -> None:
    x = make((6, 2, 16), dtype)
    x[1, 0, 3] = math.nan
    x[3, 1, 5] = math.inf
    x[4, 0, 0] = -math.inf
    weight = torch.randn(2, 2, 16) * 0.1
    weight[1, 1, 7] = math.nan  # the second modality's second pattern has a NaN scale in channel 7
    y = m2.rmsnorm(x, weight, modality_sizes=[2, 4])
    ref = oracles.rmsnorm(x, weight, modality_sizes=[2, 4])
    assert bool(y[1, 0].isnan().all())  # a NaN poisons its whole row
    assert bool(y[3, 1, 5].isnan()) and bool(y[3, 1].isnan().sum() >= 1)  # inf/inf
    assert bool(y[2:, 1, 7].isnan().all()) and bool(y[:2, 1, 7].isfinite().all())
    _check(y, ref, dtype)
    assert torch.equal(y.isnan(), ref.isnan())


def test_zero_width_and_zero_tokens() -> None:
    y = m2.rmsnorm(torch.empty(0, 3, 8, dtype=torch.bfloat16), torch.randn(2, 3, 8), modality_sizes=[0, 0])
    assert y.shape == (0, 3, 8) and y.dtype == torch.bfloat16
