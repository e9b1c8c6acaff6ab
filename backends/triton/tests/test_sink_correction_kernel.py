"""Fused sink-correction kernel against the torch reference correction (operators.md §2.3).

On CUDA: bit-exact with the torch reference in FP32-scale mode, within one ULP (and counted) in
activation mode. Under ``TRITON_INTERPRET=1`` the kernel's exp/log are numpy's, which may differ
from torch's CPU ones by an FP32 ULP, so there the scale is checked to FP32 rounding and the rescale
itself (product and rounding, which the kernel does explicitly there) is checked bit for bit against
torch applied to the kernel's own scale.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from magi2_backend_triton.sink_correction import apply_sink_correction, triton_sink_correction

from magi2_core.testing.specials import SINK_KINDS, SinkKind, sink_logits

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET or not torch.cuda.is_available() else "cuda"
INF = float("inf")
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(
    INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU (not the interpreter)"
)

try:
    from magi2_core.sink_correction.reference import sink_correction as _core_correction
except ImportError:  # the core's torch correction may not exist yet in this checkout
    _core_correction = None


def reference(
    o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, rescale: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch correction per operators.md §2.3 (upstream ``correct_out_lse_with_sink``): returns (o', lse')."""
    if _core_correction is not None:
        out, new_lse = _core_correction(o, lse, sinks, rescale=rescale)
        return out, new_lse
    sink_lse = torch.logsumexp(sinks, dim=0, keepdim=True)  # [1, H]
    lse_th = lse.transpose(0, 1)  # [T, H]
    new_lse = torch.logaddexp(lse_th, sink_lse)
    delta = lse_th - new_lse
    delta = torch.where(torch.isfinite(delta), delta, torch.full_like(delta, -INF))
    scale = torch.exp(delta).unsqueeze(-1)
    if rescale == "fp32":
        out = (o.float() * scale).to(o.dtype)
    else:
        out = o * scale.to(o.dtype)
    return out, new_lse.transpose(0, 1).contiguous()


def assert_identical(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True)


def kernel_scale(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """The kernel's own FP32 scale [T, H]: FP32-mode correction of ones is exactly the scale."""
    ones = torch.ones(lse.shape[1], lse.shape[0], 1, device=lse.device)
    return triton_sink_correction(ones, lse, sinks, rescale="fp32")[..., 0]


def within_one_ulp(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.cpu(), b.cpu()
    up = torch.nextafter(b, torch.full_like(b, INF)).double() - b.double()
    down = b.double() - torch.nextafter(b, torch.full_like(b, -INF)).double()
    fin = b.isfinite()
    if not torch.equal(a[~fin].isnan(), b[~fin].isnan()):
        return False
    err = (a.double() - b.double()).abs()[fin]
    return bool((err <= torch.maximum(up, down)[fin]).all())


def make_inputs(
    seed: int, t: int, h: int, d: int, s: int, dtype: torch.dtype, spread: float = 3.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    o = torch.randn(t, h, d, generator=g).to(dtype).to(DEVICE)
    lse = (torch.randn(h, t, generator=g) * spread + 2.0).to(DEVICE)
    sinks = (torch.randn(s, h, generator=g) * spread).to(DEVICE)
    return o, lse, sinks


def check(o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, rescale: str) -> None:
    o0, lse0, sinks0 = o.clone(), lse.clone(), sinks.clone()
    lse_out = torch.empty_like(lse, memory_format=torch.contiguous_format)
    out = triton_sink_correction(o, lse, sinks, rescale=rescale, lse_out=lse_out)
    ref_out, ref_lse = reference(o, lse, sinks, rescale)
    assert out.shape == o.shape and out.dtype == o.dtype
    if INTERPRET:
        torch.testing.assert_close(lse_out, ref_lse, rtol=1e-6, atol=1e-6, equal_nan=True)
        scale = kernel_scale(lse, sinks)
        ref_scale = torch.exp(lse.transpose(0, 1) - ref_lse.transpose(0, 1)).nan_to_num(0.0)
        # One FP32 ULP of L' (|L'| < 16) moves the scale by < 1e-6 relative; denormals by a few ULPs.
        torch.testing.assert_close(scale, ref_scale, rtol=4e-6, atol=1e-44)
        # Rescale path bit for bit, given the kernel's scale.
        if rescale == "fp32":
            expect = (o.float() * scale.unsqueeze(-1)).to(o.dtype)
        else:
            expect = o * scale.unsqueeze(-1).to(o.dtype)
        assert_identical(out, expect)
        assert within_one_ulp(out, ref_out)
    else:
        assert_identical(lse_out, ref_lse)
        if rescale == "fp32":
            assert_identical(out, ref_out)  # the contract: bit for bit
        else:
            assert within_one_ulp(out, ref_out)
    assert_identical(o, o0)
    assert_identical(lse, lse0)
    assert_identical(sinks, sinks0)
    assert sinks.dtype == torch.float32


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t,h,d,s", [(37, 3, 128, 1), (300, 2, 64, 2), (5, 4, 96, 3), (1, 1, 128, 1)])
def test_matches_reference(seed: int, rescale: str, dtype: torch.dtype, t: int, h: int, d: int, s: int) -> None:
    check(*make_inputs(seed, t, h, d, s, dtype), rescale)


@pytest.mark.parametrize("rescale", ["fp32", "activation"])
def test_denormal_scales_are_not_flushed(rescale: str) -> None:
    # L − Ls in [−104, −88]: exp(δ) is an FP32 denormal; torch keeps it, so must the kernel.
    o, _, sinks = make_inputs(4, 64, 2, 128, 1, torch.bfloat16)
    lse = (sinks[0][:, None] - torch.linspace(88.0, 104.0, 64, device=DEVICE)[None, :]).contiguous()
    check(o, lse, sinks, rescale)
    if rescale == "fp32":
        assert kernel_scale(lse, sinks)[0, 0] > 0


@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_non_finite_rules(rescale: str, dtype: torch.dtype) -> None:
    """The non-finite edge cases of operators.md §2.3, bit for bit: every one of them forces the scale to
    exactly 0 or 1."""
    h = 6
    o, lse, _ = make_inputs(5, 4, h, 128, 1, dtype)
    # Head 0..5 sinks: finite, finite, +inf, -inf, finite, -inf.
    sinks = torch.tensor([[0.5, -1.0, INF, -INF, 2.0, -INF]], device=DEVICE)
    lse[0, 0] = -INF  # L = -inf, finite sink -> 0
    lse[1, 0] = INF  # L = +inf, finite sink -> inf - inf = NaN -> 0 (not the limit 1)
    lse[4, 0] = float("nan")  # NaN L -> 0
    lse[5, 0] = -INF  # L = Ls = -inf -> NaN delta -> 0
    check(o, lse, sinks, rescale)
    out = triton_sink_correction(o, lse, sinks, rescale=rescale)
    zero = torch.zeros(128, dtype=dtype, device=DEVICE)
    for head in (0, 1, 4, 5):
        assert_identical(out[0, head], zero)
    assert_identical(out[:, 2], torch.zeros_like(out[:, 2]))  # Ls = +inf -> 0 everywhere
    assert_identical(out[1:, 3], o[1:, 3])  # Ls = -inf: L' = L, delta = 0, scale = 1


@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize("kind", SINK_KINDS)
def test_upstream_sink_kinds(kind: SinkKind, n_sinks: int, rescale: str) -> None:
    """Upstream's sink kinds (normal, large, -inf, +inf, all -inf), rows without keys (L = -inf) included."""
    check_sink_kind(kind, n_sinks, rescale, t=40, h=4, d=64)


@gpu
@needs_cuda
@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize("kind", SINK_KINDS)
def test_gpu_upstream_sink_kinds(kind: SinkKind, n_sinks: int, rescale: str) -> None:
    check_sink_kind(kind, n_sinks, rescale, t=8192, h=24, d=128)


def check_sink_kind(kind: SinkKind, n_sinks: int, rescale: str, *, t: int, h: int, d: int) -> None:
    o, lse, _ = make_inputs(7, t, h, d, 1, torch.bfloat16)
    lse[:, 5:9] = -INF
    sinks = sink_logits(kind, n_sinks, h, torch.Generator().manual_seed(n_sinks)).to(DEVICE)
    check(o, lse, sinks, rescale)
    lse_out = torch.empty_like(lse)
    out = triton_sink_correction(o, lse, sinks, rescale=rescale, lse_out=lse_out)
    mass = torch.logsumexp(sinks, dim=0)
    for head in range(h):
        if mass[head] == INF:  # the head's output 0, its LSE +inf
            assert_identical(out[:, head], torch.zeros_like(out[:, head]))
            assert bool((lse_out[head] == INF).all())
        elif mass[head] == -INF:  # no sink mass: o and L exactly as given (rows without keys: o = 0)
            rows = lse[head] != -INF
            assert_identical(out[rows, head], o[rows, head])
            assert_identical(lse_out[head], lse[head])


def test_two_sinks_equal_one_merged_sink() -> None:
    # logsumexp over S: sinks (a, a) act as one sink a + log 2.
    o, lse, _ = make_inputs(6, 50, 3, 128, 1, torch.float32)
    a = torch.tensor([[0.25, -0.5, 1.0]], device=DEVICE)
    two = triton_sink_correction(o, lse, torch.cat([a, a]), rescale="fp32")
    one = triton_sink_correction(o, lse, a + torch.log(torch.tensor(2.0)).to(DEVICE), rescale="fp32")
    torch.testing.assert_close(two, one, rtol=2e-6, atol=1e-7)


def test_scale_is_sigmoid_of_gap() -> None:
    # The algebraic oracle of the upstream tests (#7307): scale = sigmoid(L − Ls), FP64.
    _, lse, sinks = make_inputs(7, 80, 4, 128, 1, torch.float32)
    scale = kernel_scale(lse, sinks).double()
    expect = torch.sigmoid(lse.double().T - sinks.double())
    torch.testing.assert_close(scale, expect, rtol=5e-6, atol=1e-12)


def test_in_place_and_strided() -> None:
    g = torch.Generator().manual_seed(8)
    wide = torch.randn(40, 3, 256, generator=g).to(torch.bfloat16).to(DEVICE)
    o = wide[..., :128]  # head rows of a wider buffer: strided, no copy needed
    lse = torch.randn(40, 3, generator=g).to(DEVICE).T  # [H, T] view with stride (1, H)
    sinks = torch.randn(1, 3, generator=g).to(DEVICE)
    check(o, lse, sinks, "fp32")
    expect = reference(o, lse, sinks, "fp32")[0] if not INTERPRET else None
    target = o.clone()
    res = triton_sink_correction(target, lse, sinks, rescale="fp32", out=target)
    assert res.data_ptr() == target.data_ptr()
    if expect is not None:
        assert_identical(target, expect)
    else:
        assert_identical(target, (o.float() * kernel_scale(lse, sinks).unsqueeze(-1)).to(o.dtype))


@pytest.mark.parametrize("rescale", ["fp32", "activation"])
def test_contributed_apply_is_the_validating_entry_in_place(rescale: str) -> None:
    # The SinkCorrectionFn that the plugin contributes: launch-only, in place on o, same bits.
    o, lse, sinks = make_inputs(21, 37, 3, 64, 2, torch.bfloat16)
    want_lse = torch.empty_like(lse)
    want = triton_sink_correction(o, lse, sinks, rescale=rescale, lse_out=want_lse)  # type: ignore[arg-type]
    target = o.clone()
    got, got_lse = apply_sink_correction(target, lse, sinks, rescale=rescale, return_lse=True)  # type: ignore[arg-type]
    assert got.data_ptr() == target.data_ptr() and got_lse is not None
    assert_identical(got, want)
    assert_identical(got_lse, want_lse)
    assert apply_sink_correction(o.clone(), lse, sinks, rescale=rescale, return_lse=False)[1] is None  # type: ignore[arg-type]


def test_no_sinks_is_identity() -> None:
    o, lse, _ = make_inputs(9, 10, 2, 64, 1, torch.bfloat16)
    empty = torch.empty(0, 2, device=DEVICE)
    assert triton_sink_correction(o, lse, empty, rescale="fp32") is o
    out = torch.empty_like(o)
    triton_sink_correction(o, lse, empty, rescale="activation", out=out)
    assert_identical(out, o)


def test_rejects_bad_arguments() -> None:
    o, lse, sinks = make_inputs(10, 8, 2, 64, 1, torch.bfloat16)
    with pytest.raises(ValueError, match=r"lse must be \[H, T\]"):
        triton_sink_correction(o, lse.T.contiguous(), sinks, rescale="fp32")
    with pytest.raises(ValueError, match="sinks must be"):
        triton_sink_correction(o, lse, torch.zeros(1, 3, device=DEVICE), rescale="fp32")
    with pytest.raises(ValueError, match="FP32"):
        triton_sink_correction(o, lse, sinks.bfloat16(), rescale="fp32")
    with pytest.raises(ValueError, match="rescale"):
        triton_sink_correction(o, lse, sinks, rescale="bf16")  # type: ignore[arg-type]


@gpu
@needs_cuda
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("t,s", [(4096, 1), (8192, 2), (14601, 1), (1000, 3)])
def test_gpu_magi2_shapes(seed: int, rescale: str, dtype: torch.dtype, t: int, s: int) -> None:
    check(*make_inputs(seed, t, 24, 128, s, dtype, spread=6.0), rescale)


@gpu
@needs_cuda
def test_gpu_activation_mode_exactness_is_reported() -> None:
    """Activation mode is the same FP32-product-then-round as torch's BF16 multiply: expect 0 diffs."""
    o, lse, sinks = make_inputs(11, 8192, 24, 128, 1, torch.bfloat16)
    out = triton_sink_correction(o, lse, sinks, rescale="activation")
    ref = reference(o, lse, sinks, "activation")[0]
    differing = int((out.view(torch.int16) != ref.view(torch.int16)).sum())
    print(f"activation mode: {differing} of {out.numel()} BF16 values differ from torch")
    assert within_one_ulp(out, ref)
