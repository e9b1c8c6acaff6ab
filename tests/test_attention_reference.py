"""``magi2_core.attention`` on CPU (the reference provider) against the float64 oracle (operators.md §2.2-2.5).

Contract tolerances come from ``acceptance.py``; the reference also promises more, which is pinned
here: its output is the FP32 result rounded once, so it sits within one ULP of the oracle's value
in the output dtype (plus the FP32 accumulation floor where a row cancels to ~0), and its LSE is
FP32-accurate (1e-5) for every input dtype.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import oracles
import pytest
import torch

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_attention, accept_lse

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# |Δ| floor from FP32 accumulation: a row whose weighted sum cancels to ~0 has no relative accuracy.
FP32_FLOOR = 2e-6


def _cu(*lengths: int) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _check(o: torch.Tensor, lse: torch.Tensor, ref: oracles.AttentionResult, dtype: torch.dtype) -> None:
    assert o.dtype == dtype and lse.dtype == torch.float32
    assert lse.shape == (o.shape[1], o.shape[0]) and lse.is_contiguous()
    expected = ref.o.to(dtype)
    verdict = accept_attention(o, expected)
    assert verdict, str(verdict)
    lse_verdict = accept_lse(lse, ref.lse.float(), dtype)
    assert lse_verdict, str(lse_verdict)
    # tighter: one rounding of an FP32-accurate value; FP32 inputs at the FP32 floor
    off = oracles.ulps_off(o, ref.o, ulps=0 if dtype == torch.float32 else 1, atol=FP32_FLOOR)
    assert off is None, off
    finite = torch.isfinite(ref.lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse.double()[finite], ref.lse[finite], rtol=0, atol=1e-5)


# (q lengths, k lengths, Hq, Hkv, D): odd sizes, GQA 3:1 and 2:1, MHA, empty q / k segments
LAYOUTS = {
    "gqa3-odd": ((5, 0, 19, 7), (9, 4, 0, 27), 6, 2, 24),
    "mha-one": ((13,), (11,), 3, 3, 40),
    "gqa2-many": ((1, 2, 3, 8, 1), (3, 1, 5, 2, 9), 4, 2, 16),
    "mqa": ((17, 6), (6, 17), 5, 1, 8),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", list(LAYOUTS), ids=str)
@pytest.mark.parametrize(("softcap", "n_sinks"), [(0.0, 0), (-1.0, 1), (2.5, 0), (4.0, 2)])
def test_matches_oracle(
    seed: int, make: oracles.MakeTensor, dtype: torch.dtype, layout: str, softcap: float, n_sinks: int
) -> None:
    lq, lk, hq, hkv, d = LAYOUTS[layout]
    q = make((sum(lq), hq, d), dtype, scale=1.5)
    k = make((sum(lk), hkv, d), dtype, scale=1.5)
    v = make((sum(lk), hkv, d), dtype)
    sinks = torch.randn(n_sinks, hq) * 2 if n_sinks else None
    cu_q, cu_k = _cu(*lq), _cu(*lk)
    o, lse = m2.attention(q, k, v, cu_q, cu_k, softcap=softcap, sinks=sinks, return_lse=True)
    _check(o, lse, oracles.attention(q, k, v, cu_q, cu_k, softcap=softcap, sinks=sinks), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_inputs_and_int64_prefix_sums(make: oracles.MakeTensor, dtype: torch.dtype) -> None:
    q = make((23, 4, 16), dtype, contiguous=False)
    k = make((29, 2, 16), dtype, contiguous=False)
    v = make((29, 2, 16), dtype, contiguous=False)
    cu_q = torch.tensor([0, 10, 23], dtype=torch.int64)
    cu_k = torch.tensor([0, 4, 29], dtype=torch.int64)
    sinks = torch.randn(3, 8)[:, ::2]  # a non-contiguous FP32 [S, Hq] view
    o, lse = m2.attention(
        q, k, v, cu_q, cu_k, sinks=sinks, softcap=3.0, max_seqlen_q=40, max_seqlen_k=40, return_lse=True
    )
    _check(o, lse, oracles.attention(q, k, v, cu_q, cu_k, sinks=sinks, softcap=3.0), dtype)


@pytest.mark.parametrize("scale", [0.05, 0.3])
def test_explicit_softmax_scale(make: oracles.MakeTensor, scale: float) -> None:
    q, k, v = make((9, 2, 32)), make((12, 2, 32)), make((12, 2, 32))
    cu_q, cu_k = _cu(4, 5), _cu(7, 5)
    o, lse = m2.attention(q, k, v, cu_q, cu_k, softmax_scale=scale, return_lse=True)
    ref = oracles.attention(q, k, v, cu_q, cu_k, softmax_scale=scale)
    _check(o, lse, ref, torch.float32)
    default = oracles.attention(q, k, v, cu_q, cu_k)
    assert not torch.allclose(ref.o, default.o, atol=1e-3)  # the scale is really used


def test_non_positive_softcap_is_off(make: oracles.MakeTensor) -> None:
    q, k, v = (
        make((11, 2, 16), torch.bfloat16, scale=3),
        make((8, 2, 16), torch.bfloat16, scale=3),
        make((8, 2, 16), torch.bfloat16),
    )
    cu_q, cu_k = _cu(11), _cu(8)
    off = m2.attention(q, k, v, cu_q, cu_k, softcap=0.0)
    assert torch.equal(m2.attention(q, k, v, cu_q, cu_k, softcap=-1.0), off)
    capped = m2.attention(q, k, v, cu_q, cu_k, softcap=1.0)
    assert not torch.equal(capped, off)  # large scores: a cap of 1 changes the softmax


def test_sinks_are_not_capped(make: oracles.MakeTensor) -> None:
    """A sink logit far above the cap must still dominate the denominator (it is not tanh-capped)."""
    q, k, v = make((6, 2, 8)), make((6, 2, 8)), make((6, 2, 8))
    sinks = torch.tensor([[6.0, -6.0]])
    cu = _cu(6)
    o, lse = m2.attention(q, k, v, cu, cu, softcap=1.0, sinks=sinks, return_lse=True)
    ref = oracles.attention(q, k, v, cu, cu, softcap=1.0, sinks=sinks)
    _check(o, lse, ref, torch.float32)
    assert float(lse[0].min()) > 6.0  # capped it would be at most log(6·e + e)


def test_empty_key_segment_gives_zero_rows(make: oracles.MakeTensor) -> None:
    q, k, v = make((7, 2, 8)), make((5, 2, 8)), make((5, 2, 8))
    cu_q, cu_k = _cu(3, 4), _cu(0, 5)
    o, lse = m2.attention(q, k, v, cu_q, cu_k, return_lse=True)
    assert torch.equal(o[:3], torch.zeros(3, 2, 8))
    assert bool(torch.isneginf(lse[:, :3]).all())
    _check(o, lse, oracles.attention(q, k, v, cu_q, cu_k), torch.float32)
    sinks = torch.randn(2, 2)
    o, lse = m2.attention(q, k, v, cu_q, cu_k, sinks=sinks, return_lse=True)
    assert torch.equal(o[:3], torch.zeros(3, 2, 8))  # L = -inf -> scale 0, not NaN
    assert torch.allclose(lse[:, :3], torch.logsumexp(sinks, 0)[:, None].expand(2, 3))  # only the sinks remain
    _check(o, lse, oracles.attention(q, k, v, cu_q, cu_k, sinks=sinks), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("cu", [[0], [0, 0], [0, 0, 0]], ids=["B0", "B1", "B2"])
def test_zero_tokens(dtype: torch.dtype, cu: list[int]) -> None:
    q, k, v = (torch.empty(0, 4, 16, dtype=dtype) for _ in range(3))
    t = torch.tensor(cu, dtype=torch.int32)
    o, lse = m2.attention(q, k, v, t, t, sinks=torch.randn(1, 4), return_lse=True)
    assert o.shape == (0, 4, 16) and o.dtype == dtype
    assert lse.shape == (4, 0) and lse.dtype == torch.float32


def test_queries_without_keys_anywhere(make: oracles.MakeTensor) -> None:
    q = make((4, 2, 8))
    k = v = torch.empty(0, 2, 8)
    o, lse = m2.attention(q, k, v, _cu(4), _cu(0), return_lse=True)
    assert torch.equal(o, torch.zeros_like(q)) and bool(torch.isneginf(lse).all())


def test_return_lse_false_gives_only_the_output(make: oracles.MakeTensor) -> None:
    q, k, v = make((5, 2, 8)), make((5, 2, 8)), make((5, 2, 8))
    o = m2.attention(q, k, v, _cu(5), _cu(5))
    assert isinstance(o, torch.Tensor) and o.shape == q.shape


def test_inputs_are_not_mutated(make: oracles.MakeTensor) -> None:
    q, k, v = make((9, 4, 8), torch.bfloat16), make((9, 2, 8), torch.bfloat16), make((9, 2, 8), torch.bfloat16)
    sinks = torch.randn(1, 4)
    before = [t.clone() for t in (q, k, v, sinks)]
    m2.attention(q, k, v, _cu(9), _cu(9), sinks=sinks, softcap=2.0)
    for t, b in zip((q, k, v, sinks), before, strict=True):
        assert torch.equal(t, b)
    assert sinks.dtype == torch.float32


# A 32k-token segment would need a 4 GiB FP32 score matrix per head if the reference did not chunk
# the queries. The child process reports its peak RSS; the bound leaves room for torch itself.
# It runs on one thread: torch's FP32 exp on a second OpenMP thread was seen far off on a development
# host (docs/contributing.md), and this row-exact check fails with it. The reference is exact where
# torch's exp is.
_LONG_SCRIPT = textwrap.dedent("""
    import json, resource, sys, time
    import torch
    import magi2_core as m2
    torch.set_num_threads(1)
    torch.manual_seed(7)
    T, D = 32768, 16
    q, k, v = (torch.randn(T, 1, D) for _ in range(3))
    cu = torch.tensor([0, T], dtype=torch.int32)
    rows = torch.tensor([0, 1, 4097, 16383, 32767])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    sinks = torch.randn(1, 1)
    o, lse = m2.attention(q, k, v, cu, cu, sinks=sinks, return_lse=True)
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    torch.save({"q": q[rows], "k": k, "v": v, "sinks": sinks, "o": o[rows], "lse": lse[:, rows]}, sys.argv[1])
    print(json.dumps({"base_kib": base, "peak_kib": peak, "seconds": dt}))
""")


@pytest.mark.slow  # ~10-20 s on 2 cores: 1G scores through logsumexp/exp in 64 MiB chunks
def test_32k_token_segment_stays_bounded(tmp_path: Path) -> None:
    out = f"{tmp_path}/long.pt"
    proc = subprocess.run([sys.executable, "-c", _LONG_SCRIPT, out], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    grown_mib = (stats["peak_kib"] - stats["base_kib"]) / 1024
    assert grown_mib < 1024, f"attention on 32k tokens grew the RSS by {grown_mib:.0f} MiB (unbounded scores?)"
    data = torch.load(out)
    # attention is row-wise: the oracle on the sampled query rows against the whole segment
    n, tk = data["q"].shape[0], data["k"].shape[0]
    ref = oracles.attention(data["q"], data["k"], data["v"], [0, n], [0, tk], sinks=data["sinks"])
    off = oracles.ulps_off(data["o"], ref.o, ulps=0, atol=FP32_FLOOR)
    assert off is None, off
    assert torch.allclose(data["lse"].double(), ref.lse, rtol=0, atol=1e-5)
