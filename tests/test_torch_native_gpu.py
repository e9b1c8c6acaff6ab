"""The torch-native CUDA providers against the float64 oracle: ``torch_varlen`` attention (FA2 inside
torch, plus the FP32 sink correction) and ``torch_native`` rmsnorm (``F.rms_norm`` on FP32).

They must meet the same contracts as the reference (``acceptance.py``). Skipped without CUDA. When
the installed torch cannot serve a case (no ``varlen_attn``, no ``scale=``, or no GQA, which the
descriptor then leaves out), the provider's reasons are shown in the skip message rather than failing
the suite.
"""

from __future__ import annotations

import oracles
import pytest
import torch

import magi2_core as m2
from magi2_core import ProviderNotEligibleError
from magi2_core.contracts.acceptance import accept_attention, accept_lse, accept_rmsnorm
from magi2_core.reasons import Reason, ReasonCode
from magi2_core.testing.specials import SINK_KINDS, SinkKind, sink_logits

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
CUDA = torch.device("cuda")


def _runtime_only(reason: Reason) -> bool:
    """A reason that depends on the installed torch or device: a run-time refusal, or a static one from
    a descriptor that is itself derived from this torch (torch 2.11's varlen_attn has no enable_gqa, so
    the descriptor leaves GQA out and the resolver refuses it before the kernel is asked)."""
    return reason.code in (ReasonCode.UNAVAILABLE, ReasonCode.CHECK, ReasonCode.FEATURE)


def _require(op: str, provider: str, *args: object, **kwargs: object) -> None:
    """Skip (with the provider's reasons) only when the provider is unusable on this torch/device."""
    try:
        m2.resolve(op, *args, provider=provider, **kwargs)
    except ProviderNotEligibleError as err:
        assert err.resolution is not None
        mine = [c for c in err.resolution.candidates if c.provider == provider]
        if mine and mine[0].reasons and all(_runtime_only(r) for r in mine[0].reasons):
            pytest.skip(f"{provider} cannot serve this case here: " + "; ".join(str(r) for r in mine[0].reasons))
        raise


def _cu(*lengths: int) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=CUDA)


ATTN_CASES = {
    # (q lengths, k lengths, Hq, Hkv, D, sinks)
    "mha-no-sink": ((37, 263), (41, 289), 4, 4, 64, 0),
    "mha-one-sink-odd": ((5, 1, 77, 0, 30), (7, 3, 64, 5, 30), 4, 4, 128, 1),
    "mha-two-sinks": ((300,), (330,), 2, 2, 64, 2),
    "gqa3-one-sink": ((300,), (330,), 6, 2, 128, 1),
    "gqa2-two-sinks-odd": ((5, 1, 77, 30), (7, 3, 64, 30), 4, 2, 64, 2),
    "mqa-long": ((1024, 200), (1024, 200), 8, 1, 128, 1),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("case", list(ATTN_CASES), ids=str)
@pytest.mark.parametrize("sink_rescale", ["fp32", "activation"])
def test_torch_varlen_matches_oracle(
    seed: int, make: oracles.MakeTensor, dtype: torch.dtype, case: str, sink_rescale: str
) -> None:
    lq, lk, hq, hkv, d, n_sinks = ATTN_CASES[case]
    q = make((sum(lq), hq, d), dtype).to(CUDA)
    k = make((sum(lk), hkv, d), dtype).to(CUDA)
    v = make((sum(lk), hkv, d), dtype).to(CUDA)
    sinks = (torch.randn(n_sinks, hq) * 2).to(CUDA) if n_sinks else None
    cu_q, cu_k = _cu(*lq), _cu(*lk)
    kw = {
        "max_seqlen_q": max(lq),
        "max_seqlen_k": max(lk),
        "sinks": sinks,
        "sink_rescale": sink_rescale,
        "return_lse": True,
    }
    _require("attention", "torch_varlen", q, k, v, cu_q, cu_k, **kw)
    sinks_before = None if sinks is None else sinks.clone()
    o, lse = m2.attention(q, k, v, cu_q, cu_k, provider="torch_varlen", **kw)
    ref = oracles.attention(q, k, v, cu_q.cpu(), cu_k.cpu(), sinks=sinks)
    assert o.device.type == "cuda" and o.dtype == dtype and lse.shape == (hq, q.shape[0])
    verdict = accept_attention(o.cpu(), ref.o.to(dtype))
    assert verdict, str(verdict)
    lse_verdict = accept_lse(lse.cpu(), ref.lse.float(), dtype)
    assert lse_verdict, str(lse_verdict)
    if sinks is not None:
        assert sinks_before is not None and torch.equal(sinks, sinks_before) and sinks.dtype == torch.float32


def test_torch_varlen_agrees_with_the_reference_on_the_same_device(make: oracles.MakeTensor) -> None:
    """Same inputs, forced reference on CUDA: the two providers within the attention contract."""
    q = make((129, 4, 64), torch.bfloat16).to(CUDA)
    k = make((150, 4, 64), torch.bfloat16).to(CUDA)
    v = make((150, 4, 64), torch.bfloat16).to(CUDA)
    cu_q, cu_k = _cu(60, 69), _cu(70, 80)
    sinks = torch.randn(1, 4, device=CUDA)
    kw = {"max_seqlen_q": 69, "max_seqlen_k": 80, "sinks": sinks}
    _require("attention", "torch_varlen", q, k, v, cu_q, cu_k, **kw)
    fast = m2.attention(q, k, v, cu_q, cu_k, provider="torch_varlen", **kw)
    exact = m2.attention(q, k, v, cu_q, cu_k, provider="reference", **kw)
    verdict = accept_attention(fast.cpu(), exact.cpu())
    assert verdict, str(verdict)


NORM_CASES = {
    # (M, P, T, heads, sizes, D)
    "qk-norm-P1-heads": (1, 1, 257, 24, None, 128),
    "pre-norm-M3": (3, 1, 301, None, [100, 0, 201], 3072),
    "M3-P4": (3, 4, 97, 4, [40, 50, 7], 1536),
    "T0": (3, 4, 0, 4, [0, 0, 0], 128),
}


@pytest.mark.parametrize(
    ("dtype", "out_dtype"),
    [(torch.float32, None), (torch.bfloat16, None), (torch.float16, None), (torch.bfloat16, torch.float32)],
    ids=str,
)
@pytest.mark.parametrize("case", list(NORM_CASES), ids=str)
def test_torch_native_rmsnorm_matches_oracle(
    seed: int, make: oracles.MakeTensor, dtype: torch.dtype, out_dtype: torch.dtype | None, case: str
) -> None:
    m, p, t, heads, sizes, d = NORM_CASES[case]
    shape = (t, d) if heads is None else (t, heads, d)
    x = make(shape, dtype, scale=2.0, contiguous=seed != 3).to(CUDA)
    weight = (torch.randn(m, p, d) * 0.1).to(CUDA)
    _require("rmsnorm", "torch_native", x, weight, modality_sizes=sizes, out_dtype=out_dtype)
    y = m2.rmsnorm(x, weight, modality_sizes=sizes, out_dtype=out_dtype, provider="torch_native")
    od = out_dtype or dtype
    expected = oracles.rmsnorm(x, weight, modality_sizes=sizes)
    assert y.device.type == "cuda" and y.dtype == od
    verdict = accept_rmsnorm(y.cpu(), expected.to(od))
    assert verdict, str(verdict)


@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize("sink_rescale", ["fp32", "activation"])
@pytest.mark.parametrize("kind", SINK_KINDS)
@pytest.mark.parametrize("provider", ["torch_varlen", "reference"])
def test_upstream_sink_kinds_on_cuda(
    make: oracles.MakeTensor, provider: str, kind: SinkKind, sink_rescale: str, n_sinks: int
) -> None:
    """Upstream's sink kinds (normal, large, -inf, +inf, all -inf) on CUDA against the float64 oracle."""
    lq, lk = (5, 1, 77, 30, 200), (7, 3, 0, 30, 250)  # the third segment has queries but no keys
    q = make((sum(lq), 4, 64), torch.bfloat16).to(CUDA)
    k = make((sum(lk), 2, 64), torch.bfloat16).to(CUDA)
    v = make((sum(lk), 2, 64), torch.bfloat16).to(CUDA)
    sinks = sink_logits(kind, n_sinks, 4, torch.Generator().manual_seed(n_sinks)).to(CUDA)
    cu_q, cu_k = _cu(*lq), _cu(*lk)
    kw = {"max_seqlen_q": max(lq), "max_seqlen_k": max(lk), "sink_rescale": sink_rescale, "return_lse": True}
    _require("attention", provider, q, k, v, cu_q, cu_k, sinks=sinks, **kw)
    o, lse = m2.attention(q, k, v, cu_q, cu_k, sinks=sinks, provider=provider, **kw)
    ref = oracles.attention(q, k, v, cu_q.cpu(), cu_k.cpu(), sinks=sinks)
    verdict = accept_attention(o.cpu(), ref.o.to(torch.bfloat16))
    assert verdict, str(verdict)
    lse_verdict = accept_lse(lse.cpu(), ref.lse.float(), torch.bfloat16)
    assert lse_verdict, str(lse_verdict)
    plain_o, plain_lse = m2.attention(q, k, v, cu_q, cu_k, provider=provider, **kw)
    assert oracles.sink_kind_violations(o, lse, sinks, plain_o, plain_lse) == []


@pytest.mark.parametrize("shape", [(5, 3, 0), (0, 0), (0, 3, 64)], ids=str)
@pytest.mark.parametrize("provider", ["torch_native", "reference"])
def test_rmsnorm_of_an_empty_input_is_the_empty_result_on_cuda(provider: str, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, device=CUDA).to(torch.bfloat16)
    w = torch.randn(2, shape[1] if len(shape) == 3 else 1, shape[-1], device=CUDA)
    sizes = [shape[0] // 2, shape[0] - shape[0] // 2]
    _require("rmsnorm", provider, x, w, modality_sizes=sizes)
    y = m2.rmsnorm(x, w, modality_sizes=sizes, provider=provider)
    assert y.shape == x.shape and y.dtype == x.dtype and y.device.type == "cuda"
