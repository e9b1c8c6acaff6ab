"""Fused multi-modality RMSNorm kernel against the FP32 reference (operators.md §4.4 contract).

The oracle is the reference backend's ``reference_rmsnorm_fp32`` (modality groups split dim 0).

Runs on CUDA when present, otherwise under ``TRITON_INTERPRET=1`` on small shapes. Under the
interpreter an FP32 -> BF16 cast truncates, so there the "output == FP32 result cast" check uses the
kernel's own FP32 result for BF16 only through the one-ULP bound; FP16/FP32 casts are exact there too.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

import magi2_core as m2
from magi2_core.errors import InvalidShapeError

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from magi2_backend_reference.rmsnorm import reference_rmsnorm_fp32 as reference_fp32
from magi2_backend_triton.rmsnorm import triton_rmsnorm

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
EPS = 1e-6
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(
    INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU (not the interpreter)"
)


def assert_identical(a: torch.Tensor, b: torch.Tensor) -> None:
    """Same dtype, shape and values, NaN where NaN (torch.equal treats NaN as unequal)."""
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True)


def local_ulp(ref: torch.Tensor) -> torch.Tensor:
    """Larger gap from each reference value to its two neighbours in ref's dtype, as FP64."""
    up = torch.nextafter(ref, torch.full_like(ref, float("inf"))).double()
    down = torch.nextafter(ref, torch.full_like(ref, float("-inf"))).double()
    r = ref.double()
    return torch.maximum(up - r, r - down)


def check_contract(
    x: torch.Tensor,
    weight: torch.Tensor,
    sizes: list[int] | None,
    out_dtype: torch.dtype | None,
) -> None:
    x_before, w_before = x.clone(), weight.clone()
    f32 = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    y = triton_rmsnorm(x, weight, eps=EPS, modality_sizes=sizes, out_dtype=out_dtype, fp32_out=f32)
    ref = reference_fp32(x.cpu(), weight.cpu(), EPS, sizes)
    dtype = out_dtype or x.dtype
    assert y.shape == x.shape and y.dtype == dtype and y.is_contiguous()
    # (a) pre-cast FP32 within rtol = atol = 1e-6 of the FP32 reference.
    torch.testing.assert_close(f32.cpu(), ref, rtol=1e-6, atol=1e-6, equal_nan=True)
    # (b) the returned tensor is exactly the FP32 result cast once (BF16 only on the GPU: trap 2).
    if not (INTERPRET and dtype == torch.bfloat16):
        assert_identical(y, f32.to(dtype))
    # (d) final output within one local ULP of the reference's own cast output.
    ref_out = ref.to(dtype)
    y_c = y.cpu()
    finite = ref_out.isfinite()
    assert_identical(y_c[~finite], ref_out[~finite])  # NaN and ±inf where the reference has them
    if dtype == torch.float32:
        torch.testing.assert_close(y_c, ref, rtol=1e-6, atol=1e-6, equal_nan=True)
    else:
        err = (y_c.double() - ref_out.double()).abs()[finite]
        assert bool((err <= local_ulp(ref_out)[finite]).all()), f"max error {err.max()}"
    assert_identical(x, x_before)  # inputs untouched
    assert_identical(weight, w_before)


DTYPE_CASES = [
    (torch.bfloat16, None),
    (torch.float16, None),
    (torch.float32, None),
    (torch.bfloat16, torch.float32),
]
# (D, M, P, x shape before D, modality sizes): interpreter shapes stay small in T.
WIDTH_CASES = [
    (128, 3, 4, (7, 4), [3, 0, 4]),
    (128, 1, 1, (9, 24), None),
    (768, 3, 1, (9,), [2, 5, 2]),
    (1536, 3, 4, (7, 4), [1, 4, 2]),
    (3072, 3, 1, (6,), [2, 2, 2]),
    (12288, 1, 1, (3,), None),
]


@pytest.mark.parametrize("seed", [91, 92, 93])
@pytest.mark.parametrize("dtype,out_dtype", DTYPE_CASES, ids=lambda v: str(v).replace("torch.", ""))
@pytest.mark.parametrize("d,m,p,lead,sizes", WIDTH_CASES, ids=lambda v: str(v))
def test_matches_reference(
    seed: int,
    dtype: torch.dtype,
    out_dtype: torch.dtype | None,
    d: int,
    m: int,
    p: int,
    lead: tuple[int, ...],
    sizes: list[int] | None,
) -> None:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*lead, d, generator=g) * 3 + 0.5).to(dtype).to(DEVICE)
    weight = (torch.randn(m, p, d, generator=g) * 0.2).to(DEVICE)
    check_contract(x, weight, sizes, out_dtype)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_strided_inputs_read_in_place(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(3, 4, 128, generator=g) * 0.2).to(DEVICE)
    wide = torch.randn(7, 4, 256, generator=g).to(torch.bfloat16).to(DEVICE)
    check_contract(wide[..., ::2], weight, [3, 0, 4], None)  # strided last dim (operators.md §4.4)
    check_contract(wide[..., 64:192], weight, [3, 0, 4], torch.float32)  # column slice of wider rows
    rows = torch.randn(10, 3 * 768, generator=g).to(torch.float16).to(DEVICE)
    w1 = (torch.randn(1, 1, 768, generator=g) * 0.2).to(DEVICE)
    check_contract(rows[:, 768 : 2 * 768], w1, None, None)  # [T, D] view with row stride 2304


def test_multi_dim_leading_and_broadcast_heads() -> None:
    g = torch.Generator().manual_seed(5)
    w1 = (torch.randn(2, 1, 128, generator=g) * 0.2).to(DEVICE)
    x = torch.randn(2, 3, 6, 128, generator=g).to(torch.bfloat16).to(DEVICE)  # tokens = dim 0
    check_contract(x, w1, [1, 1], torch.float32)
    # Middle dims that cannot be collapsed into one stride (a transposed batch): copied, still right.
    check_contract(x.transpose(0, 1), w1, [1, 2], None)
    w4 = (torch.randn(3, 6, 128, generator=g) * 0.2).to(DEVICE)  # P = 6 patterns behind a middle dim
    check_contract(x.transpose(0, 1), w4, [2, 0, 1], None)


def test_many_modalities_split_launches() -> None:
    g = torch.Generator().manual_seed(6)
    sizes = [2, 0, 3, 1, 0, 4, 2]  # M = 7 > 4 modalities per launch
    weight = (torch.randn(7, 1, 256, generator=g) * 0.3).to(DEVICE)
    x = torch.randn(12, 256, generator=g).to(torch.bfloat16).to(DEVICE)
    check_contract(x, weight, sizes, None)


def test_modality_scales_really_differ() -> None:
    # Guards against a kernel that ignores the modality index: each group gets a distinct scale.
    x = torch.randn(6, 128, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    weight = torch.stack([torch.full((1, 128), float(v)) for v in (0.0, 1.0, 3.0)]).to(DEVICE)
    y = triton_rmsnorm(x, weight, eps=EPS, modality_sizes=[2, 1, 3], out_dtype=None)
    n = F.rms_norm(x.cpu(), (128,), None, EPS)
    expect = torch.cat([n[:2], 2 * n[2:3], 4 * n[3:]])
    torch.testing.assert_close(y.cpu(), expect, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_empty_tokens(out_dtype: torch.dtype | None) -> None:
    weight = torch.randn(3, 4, 128).to(DEVICE)
    x = torch.randn(0, 4, 128).to(torch.bfloat16).to(DEVICE)
    y = triton_rmsnorm(x, weight, eps=EPS, modality_sizes=[0, 0, 0], out_dtype=out_dtype)
    assert y.shape == (0, 4, 128) and y.dtype == (out_dtype or torch.bfloat16)


@pytest.mark.parametrize("shape", [(5, 3, 0), (0, 0), (0, 3, 0)], ids=str)
@pytest.mark.parametrize("out_dtype", [None, torch.float32])
def test_empty_width_through_the_public_op(shape: tuple[int, ...], out_dtype: torch.dtype | None) -> None:
    """Width 0 (and no tokens): the empty result, as upstream; the provider claims it and launches nothing."""
    x = torch.randn(shape).to(torch.bfloat16).to(DEVICE)
    weight = torch.randn(2, shape[1] if len(shape) == 3 else 1, 0).to(DEVICE)
    sizes = [shape[0] // 2, shape[0] - shape[0] // 2]
    y = m2.rmsnorm(x, weight, modality_sizes=sizes, out_dtype=out_dtype, provider="triton")
    assert y.shape == x.shape and y.dtype == (out_dtype or torch.bfloat16) and y.device == x.device


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_nan_inf_propagate(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6, 768, generator=g)
    x[1, 5] = float("nan")
    x[3, 7] = float("inf")
    x[4, 0] = float("-inf")
    x = x.to(dtype).to(DEVICE)
    weight = (torch.randn(2, 1, 768, generator=g) * 0.2).to(DEVICE)
    check_contract(x, weight, [3, 3], None)
    y = triton_rmsnorm(x, weight, eps=EPS, modality_sizes=[3, 3], out_dtype=None).cpu()
    assert y[1].isnan().all()  # NaN poisons its own row's mean only
    assert y[3, 7].isnan() and (y[3, :7] == 0).all()  # inf row: inf*0 -> NaN, others -> 0
    assert y[[0, 2, 5]].isfinite().all()


def test_low_precision_weight_rounds_offset_first() -> None:
    g = torch.Generator().manual_seed(9)
    x = torch.randn(5, 128, generator=g).to(DEVICE)
    weight = (torch.randn(1, 1, 128, generator=g) * 0.3).to(torch.bfloat16).to(DEVICE)
    y = triton_rmsnorm(x, weight, eps=EPS, modality_sizes=None, out_dtype=None)
    expect = F.rms_norm(x.cpu(), (128,), None, EPS) * (weight.cpu()[0, 0] + 1).float()
    torch.testing.assert_close(y.cpu(), expect, rtol=1e-6, atol=1e-6)


def test_rejects_bad_arguments_through_the_op_contract() -> None:
    x = torch.randn(4, 3, 128).to(DEVICE)
    with pytest.raises(InvalidShapeError, match="summing to the token count"):
        triton_rmsnorm(x, torch.zeros(2, 1, 128, device=DEVICE), eps=EPS, modality_sizes=[1, 2], out_dtype=None)
    with pytest.raises(InvalidShapeError, match="to match weight's 4 patterns"):
        triton_rmsnorm(x, torch.zeros(1, 4, 128, device=DEVICE), eps=EPS, modality_sizes=None, out_dtype=None)
    with pytest.raises(InvalidShapeError, match=r"\[1, P, 128\]"):
        triton_rmsnorm(x, torch.zeros(3, 1, 128, device=DEVICE), eps=EPS, modality_sizes=[4], out_dtype=None)


@gpu
@needs_cuda
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "lead,d,m,p,sizes,out_dtype",
    [
        ((4096,), 3072, 3, 1, [2000, 0, 2096], None),
        ((4093, 24), 128, 1, 1, None, torch.float32),
        ((1500, 4), 1536, 3, 4, [700, 300, 500], None),
        ((1024,), 12288, 1, 1, None, torch.float32),
        ((777,), 768, 3, 1, [0, 777, 0], None),
    ],
    ids=str,
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_production_shapes(
    seed: int,
    lead: tuple[int, ...],
    d: int,
    m: int,
    p: int,
    sizes: list[int] | None,
    out_dtype: torch.dtype | None,
    dtype: torch.dtype,
) -> None:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*lead, d, generator=g) * 2).to(dtype).cuda()
    weight = (torch.randn(m, p, d, generator=g) * 0.2).cuda()
    check_contract(x, weight, sizes, out_dtype)
