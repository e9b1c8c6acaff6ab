"""Learned sinks: the LSE correction of operators.md §2.3, its non-finite rules and both rescale precisions."""

from __future__ import annotations

import math

import oracles
import pytest
import torch

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_attention, accept_lse
from magi2_core.model.kernel import SinkRescale
from magi2_core.sink_correction.reference import sink_correction
from magi2_core.testing import call_record
from magi2_core.testing.specials import SINK_KINDS, SinkKind, sink_logits

INF = math.inf
NAN = math.nan


def _delta_form(o32: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """operators.md §2.3 literally: ``exp(L - logaddexp(L, logsumexp(sinks)))`` as ``[T, H, 1]`` FP32."""
    new = torch.logaddexp(lse, torch.logsumexp(sinks, dim=0)[:, None])
    return torch.exp(lse - new).t().unsqueeze(-1)


def _sigmoid_form(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """The upstream tests' oracle form of the same scale (#7307): ``sigmoid(L - Ls)`` as ``[T, H, 1]``."""
    return torch.sigmoid(lse - torch.logsumexp(sinks, dim=0)[:, None]).t().unsqueeze(-1)


def _packed(make: oracles.MakeTensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """The upstream #7307 'across tiles' layout: q 300x6, k 330x2 (GQA), two uneven segments."""
    q = make((300, 6, 64), dtype)
    k = make((330, 2, 64), dtype)
    v = make((330, 2, 64), dtype)
    return q, k, v, torch.tensor([0, 37, 300], dtype=torch.int32), torch.tensor([0, 41, 330], dtype=torch.int32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("n_sinks", [1, 2])
def test_fp32_rescale_is_one_rounding_of_the_fp32_product(
    seed: int, make: oracles.MakeTensor, dtype: torch.dtype, n_sinks: int
) -> None:
    q, k, v, cu_q, cu_k = _packed(make, dtype)
    sinks = torch.randn(n_sinks, 6) * 2
    # the FP32 accumulator and LSE the reference corrects: the same computation on FP32 copies
    o32, lse = m2.attention(q.float(), k.float(), v.float(), cu_q, cu_k, return_lse=True)
    o = m2.attention(q, k, v, cu_q, cu_k, sinks=sinks, sink_rescale="fp32")
    assert torch.equal(o, (o32 * _delta_form(o32, lse, sinks)).to(dtype))  # bitwise, as written in §2.3
    # exp(δ) and sigmoid(L - Ls) are the same real number but may differ in their last FP32 bit,
    # which can move a value across a rounding midpoint: the sigmoid form holds to one ULP.
    off = oracles.ulps_off(o, (o32 * _sigmoid_form(lse, sinks)).double(), ulps=1)
    assert off is None, off
    ref = oracles.attention(q, k, v, cu_q, cu_k, sinks=sinks)
    off = oracles.ulps_off(o, ref.o, ulps=1, atol=2e-6)
    assert off is None, off


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_activation_rescale_rounds_first_and_differs_from_fp32(
    seed: int, make: oracles.MakeTensor, dtype: torch.dtype
) -> None:
    q, k, v, cu_q, cu_k = _packed(make, dtype)
    sinks = torch.randn(1, 6) * 2
    o32, lse = m2.attention(q.float(), k.float(), v.float(), cu_q, cu_k, return_lse=True)
    o_act = m2.attention(q, k, v, cu_q, cu_k, sinks=sinks, sink_rescale="activation")
    o_fp32 = m2.attention(q, k, v, cu_q, cu_k, sinks=sinks, sink_rescale="fp32")
    # the CUDA path: the kernel output is rounded, the scale is rounded, the product is rounded
    assert torch.equal(o_act, o32.to(dtype) * _delta_form(o32, lse, sinks).to(dtype))
    assert not torch.equal(o_act, o_fp32)  # operators.md §2.3: the two precisions are distinguishable
    expected = oracles.attention(q, k, v, cu_q, cu_k, sinks=sinks).o.to(dtype)
    assert accept_attention(o_act, expected)  # still within the contract


def test_rescale_modes_agree_in_fp32(make: oracles.MakeTensor) -> None:
    q, k, v, cu_q, cu_k = _packed(make, torch.float32)
    sinks = torch.randn(2, 6)
    a = m2.attention(q, k, v, cu_q, cu_k, sinks=sinks, sink_rescale="activation")
    assert torch.equal(a, m2.attention(q, k, v, cu_q, cu_k, sinks=sinks, sink_rescale="fp32"))


def test_corrected_lse_includes_the_sinks(make: oracles.MakeTensor) -> None:
    q, k, v, cu_q, cu_k = _packed(make, torch.bfloat16)
    sinks = torch.randn(2, 6)
    _, lse = m2.attention(q, k, v, cu_q, cu_k, sinks=sinks, return_lse=True)
    ref = oracles.attention(q, k, v, cu_q, cu_k, sinks=sinks)
    assert torch.allclose(lse.double(), ref.lse, rtol=0, atol=1e-5)
    assert bool((ref.lse > ref.lse_no_sinks).all())


# ---------------------------------------------------------------------------------------------
# sink_correction itself: the non-finite rules (operators.md §2.3; upstream checks them bitwise)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize(
    ("lse_value", "sink_value"),
    [(-INF, 0.5), (1.0, INF), (INF, 0.5), (NAN, 0.5), (NAN, INF), (-INF, INF)],
    ids=["L=-inf", "sink=+inf", "L=+inf", "L=nan", "L=nan,sink=+inf", "L=-inf,sink=+inf"],
)
def test_non_finite_rows_scale_to_zero(
    make: oracles.MakeTensor, rescale: str, lse_value: float, sink_value: float
) -> None:
    t, h, d = 5, 3, 8
    o = make((t, h, d), torch.bfloat16)
    lse = torch.randn(h, t)
    lse[1, 2] = lse_value  # one (head, token) row is non-finite
    sinks = torch.randn(2, h)
    sinks[0, 1] = sink_value  # applies to head 1: rows of head 1 only
    out, new_lse = sink_correction(o, lse, sinks, rescale=rescale)  # type: ignore[arg-type]
    assert out.dtype == torch.bfloat16 and new_lse.dtype == torch.float32
    assert torch.equal(out[2, 1], torch.zeros(d, dtype=torch.bfloat16))
    assert bool(torch.isfinite(out).all())
    if sink_value == INF:
        assert torch.equal(out[:, 1], torch.zeros(t, d, dtype=torch.bfloat16))  # the whole head
    untouched = torch.ones(h, t, dtype=torch.bool)
    untouched[1] = False
    scale = oracles.sink_scale(lse, sinks).t()  # [T, H], valid on the finite rows
    rows = untouched.t()
    expected = o.double() * scale[..., None]
    off = oracles.ulps_off(out[rows], expected[rows], ulps=1 if rescale == "fp32" else 2)
    assert off is None, off


def test_l_plus_inf_is_zero_not_the_limit_one() -> None:
    o = torch.randn(1, 1, 4)
    out, new_lse = sink_correction(o, torch.tensor([[INF]]), torch.tensor([[0.0]]), rescale="fp32")
    assert torch.equal(out, torch.zeros_like(o))  # bit-exact with upstream: NaN δ -> -inf -> 0
    assert new_lse.item() == INF


def test_l_minus_inf_keeps_the_sink_lse() -> None:
    sinks = torch.tensor([[0.25], [-1.5]])
    out, new_lse = sink_correction(torch.randn(2, 1, 4), torch.full((1, 2), -INF), sinks, rescale="fp32")
    assert torch.equal(out, torch.zeros(2, 1, 4))
    assert torch.allclose(new_lse.double(), torch.logsumexp(sinks.double(), 0).expand(1, 2), atol=1e-6)


def test_minus_inf_sink_changes_nothing(make: oracles.MakeTensor) -> None:
    o = make((6, 2, 8))
    lse = torch.randn(2, 6)
    out, new_lse = sink_correction(o, lse, torch.full((1, 2), -INF), rescale="fp32")
    assert torch.equal(out, o) and torch.equal(new_lse, lse)


@pytest.mark.parametrize("sinks", [None, torch.empty(0, 3)], ids=["None", "empty"])
@pytest.mark.parametrize("rescale", ["fp32", "activation"])
def test_no_sinks_returns_inputs_untouched(make: oracles.MakeTensor, sinks: torch.Tensor | None, rescale: str) -> None:
    o = make((4, 3, 8), torch.bfloat16)
    lse = torch.randn(3, 4)
    out, new_lse = sink_correction(o, lse, sinks, rescale=rescale)  # type: ignore[arg-type]
    assert out is o and new_lse is lse
    out32, same_lse = sink_correction(o.float(), lse, sinks, rescale=rescale, out_dtype=torch.bfloat16)  # type: ignore[arg-type]
    assert torch.equal(out32, o) and same_lse is lse


def test_empty_sinks_through_the_api_equal_no_sinks(make: oracles.MakeTensor) -> None:
    q, k, v = make((7, 2, 8)), make((7, 2, 8)), make((7, 2, 8))
    cu = torch.tensor([0, 7], dtype=torch.int32)
    a = m2.attention(q, k, v, cu, cu, sinks=torch.empty(0, 2), return_lse=True)
    b = m2.attention(q, k, v, cu, cu, return_lse=True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize(
    ("o_shape", "lse_shape", "sink_shape"),
    [((4, 2, 8), (2, 4), (2,)), ((4, 2, 8), (4, 2), (1, 2)), ((4, 2, 8), (2, 4), (1, 3)), ((4, 2), (2, 4), (1, 2))],
    ids=["sink-1d", "lse-transposed", "sink-heads", "o-2d"],
)
def test_shape_checks(o_shape: tuple[int, ...], lse_shape: tuple[int, ...], sink_shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="sink_correction"):
        sink_correction(torch.randn(o_shape), torch.randn(lse_shape), torch.randn(sink_shape), rescale="fp32")


# ---------------------------------------------------------------------------------------------
# upstream's sink kinds through the public op: -inf adds nothing, +inf zeroes its head (LSE +inf)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize("kind", SINK_KINDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_upstream_sink_kinds_follow_the_correction(
    make: oracles.MakeTensor, kind: SinkKind, n_sinks: int, rescale: SinkRescale, dtype: torch.dtype
) -> None:
    # GQA, an empty query segment and a query segment without keys (its rows: o = 0, L = -inf)
    q, k, v = make((40, 4, 32), dtype), make((45, 2, 32), dtype), make((45, 2, 32), dtype)
    cu_q = torch.tensor([0, 13, 13, 20, 40], dtype=torch.int32)
    cu_k = torch.tensor([0, 17, 24, 24, 45], dtype=torch.int32)
    sinks = sink_logits(kind, n_sinks, 4, torch.Generator().manual_seed(n_sinks))
    before = sinks.clone()
    o, lse = m2.attention(q, k, v, cu_q, cu_k, sinks=sinks, sink_rescale=rescale, return_lse=True)
    assert torch.equal(sinks, before)
    ref = oracles.attention(q, k, v, cu_q, cu_k, sinks=sinks)
    assert accept_attention(o, ref.o.to(dtype)), accept_attention(o, ref.o.to(dtype))
    assert accept_lse(lse, ref.lse.float(), dtype), accept_lse(lse, ref.lse.float(), dtype)
    assert bool(torch.isfinite(o).all())
    plain_o, plain_lse = m2.attention(q, k, v, cu_q, cu_k, return_lse=True)
    assert oracles.sink_kind_violations(o, lse, sinks, plain_o, plain_lse) == []
    if kind == "all_neg_inf":
        assert torch.equal(o, plain_o) and torch.equal(lse, plain_lse)
    if kind == "pos_inf":
        assert bool((o[:, 0] == 0).all()) and bool((lse[0] == INF).all())


def test_nan_sinks_are_rejected_and_infinite_ones_accepted_on_the_host() -> None:
    q = torch.randn(6, 2, 8)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    for value in (INF, -INF):
        m2.attention(q, q, q, cu, cu, sinks=torch.tensor([[value, 0.5]]))
    with pytest.raises(m2.InvalidValueError, match=r"'sinks' must be .*without NaN.*1 NaN of 4") as err:
        m2.attention(q, q, q, cu, cu, sinks=torch.tensor([[0.5, -INF], [NAN, INF]]))
    assert err.value.arg == "sinks"


class _FakeAux:
    def __init__(self, lse: bool) -> None:
        self.lse = lse


def _fake_varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux, scale, enable_gqa=False):  # type: ignore[no-untyped-def]
    """torch's varlen_attn on a CPU: the sink-free reference, rows without keys marked LSE = +inf as FA2 does."""
    from magi2_backend_reference.attention import exact_attention

    assert return_aux.lse and enable_gqa == (q.shape[1] != k.shape[1])
    o, lse = exact_attention(
        q, k, v, cu_q, cu_k, softmax_scale=scale, softcap=0.0, sinks=None, sink_rescale="fp32", return_lse=True
    )
    assert lse is not None
    return o, lse.masked_fill(lse == -INF, INF)


@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize("kind", SINK_KINDS)
def test_torch_varlen_follows_the_upstream_sink_kinds(
    make: oracles.MakeTensor, kind: SinkKind, n_sinks: int, rescale: SinkRescale
) -> None:
    """The ``torch_varlen`` provider object over a fake ``varlen_attn``: its LSE fix-up, then the correction."""
    from magi2_backend_reference.torch_attention import TorchVarlenAttention

    provider = TorchVarlenAttention()
    provider.__dict__["_api"] = (_fake_varlen_attn, _FakeAux, frozenset({"scale", "enable_gqa", "return_aux"}))
    q, k, v = make((30, 4, 32), torch.bfloat16), make((33, 2, 32), torch.bfloat16), make((33, 2, 32), torch.bfloat16)
    cu_q = torch.tensor([0, 11, 18, 30], dtype=torch.int32)
    cu_k = torch.tensor([0, 14, 14, 33], dtype=torch.int32)  # the second segment has no keys
    sinks = sink_logits(kind, n_sinks, 4, torch.Generator().manual_seed(7 + n_sinks))
    kw = {
        "max_seqlen_q": 12,
        "max_seqlen_k": 19,
        "softmax_scale": 32**-0.5,
        "softcap": 0.0,
        "sink_rescale": rescale,
        "deterministic": False,
        "return_lse": True,
    }
    o, lse = provider(call_record("attention", q, k, v, cu_q, cu_k, sinks=sinks, **kw))
    ref_o, ref_lse = m2.attention(
        q, k, v, cu_q, cu_k, sinks=sinks, sink_rescale=rescale, return_lse=True, provider="reference"
    )
    assert lse is not None and accept_attention(o, ref_o) and accept_lse(lse, ref_lse, q.dtype)
    plain_o, plain_lse = provider(call_record("attention", q, k, v, cu_q, cu_k, sinks=None, **kw))
    assert oracles.sink_kind_violations(o, lse, sinks, plain_o, plain_lse) == []
