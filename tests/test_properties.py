"""Property-based tests (hypothesis): every op's validation and its agreement with the float64 oracles
over shapes, strides, dtypes, empty segments and non-finite values.

Inputs are drawn from seeds and sizes (the tensors themselves come from torch's generator), the runs
are derandomised so CI is reproducible, and each test has a deadline and a small example budget: the
whole module stays well under a minute on two cores.
"""

from __future__ import annotations

import itertools
import math
from datetime import timedelta
from typing import Any

import oracles
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import magi2_core as m2
from magi2_core.contracts.acceptance import (
    accept_attention,
    accept_lse,
    accept_moe_experts,
    accept_moe_route,
    accept_rmsnorm,
    route_truth,
)

SETTINGS = settings(
    max_examples=15,
    deadline=timedelta(seconds=5),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.float16])


@pytest.fixture(scope="module", autouse=True)
def _loaded() -> None:
    m2.get_registry().providers("rmsnorm")  # backend discovery outside the per-example deadline


def _tensor(
    seed: int, shape: tuple[int, ...], dtype: torch.dtype, *, contiguous: bool = True, scale: float = 1.0
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if contiguous:
        return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    wide = torch.randn((*shape[:-1], 2 * shape[-1]), generator=g, dtype=torch.float64) * scale
    return wide.to(dtype)[..., ::2]  # every other element of the last dim: a strided view


def _prefix(lengths: list[int]) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


# -- attention -------------------------------------------------------------------------------------------------
segments = st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=3)


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    segs=segments,
    hkv=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 2]),
    d=st.sampled_from([8, 16]),
    dtype=DTYPES,
    n_sinks=st.integers(0, 2),
    softcap=st.sampled_from([0.0, 2.5]),
    contiguous=st.booleans(),
)
def test_attention_agrees_with_the_oracle(
    seed: int,
    segs: list[tuple[int, int]],
    hkv: int,
    group: int,
    d: int,
    dtype: torch.dtype,
    n_sinks: int,
    softcap: float,
    contiguous: bool,
) -> None:
    hq = hkv * group
    lq, lk = [s[0] for s in segs], [s[1] for s in segs]
    q = _tensor(seed, (sum(lq), hq, d), dtype, contiguous=contiguous, scale=1.5)
    k = _tensor(seed + 1, (sum(lk), hkv, d), dtype, contiguous=contiguous, scale=1.5)
    v = _tensor(seed + 2, (sum(lk), hkv, d), dtype, contiguous=contiguous)
    sinks = _tensor(seed + 3, (n_sinks, hq), torch.float32, scale=2.0) if n_sinks else None
    cu_q, cu_k = _prefix(lq), _prefix(lk)
    o, lse = m2.attention(q, k, v, cu_q, cu_k, softcap=softcap, sinks=sinks, return_lse=True)
    ref = oracles.attention(q, k, v, cu_q, cu_k, softcap=softcap, sinks=sinks)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == (hq, q.shape[0])
    assert accept_attention(o, ref.o.to(dtype)), accept_attention(o, ref.o.to(dtype))
    assert accept_lse(lse, ref.lse.float(), dtype), accept_lse(lse, ref.lse.float(), dtype)


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    lengths=st.lists(st.integers(1, 5), min_size=2, max_size=3),
    where=st.sampled_from(["q", "k"]),
    value=st.sampled_from([math.nan, math.inf]),
)
def test_attention_non_finite_values_stay_in_their_segment(
    seed: int, lengths: list[int], where: str, value: float
) -> None:
    q = _tensor(seed, (sum(lengths), 2, 8), torch.float32)
    k = _tensor(seed + 1, (sum(lengths), 2, 8), torch.float32)
    v = _tensor(seed + 2, (sum(lengths), 2, 8), torch.float32)
    cu = _prefix(lengths)
    clean = m2.attention(q, k, v, cu, cu)
    (q if where == "q" else k)[0, 0, 0] = value  # the first token of the first segment
    o = m2.attention(q, k, v, cu, cu)
    first = lengths[0]
    assert torch.equal(o[first:], clean[first:])  # other segments untouched
    if where == "k" and value == math.inf:
        # The key's scores in head 0 are -inf for queries whose matching coordinate is negative: those
        # rows drop the key and stay finite, unless it is their segment's only key.
        hit = (q[:first, 0, 0] >= 0) | (first == 1)
        assert torch.equal(~torch.isfinite(o[:first, 0]).all(-1), hit)
    else:
        assert not bool(torch.isfinite(o[0, 0]).all())  # the affected row is not a finite answer


bad_prefix = st.lists(st.integers(-3, 12), min_size=1, max_size=5)


@SETTINGS
@given(
    cu=bad_prefix,
    max_q=st.one_of(st.none(), st.integers(-2, 12)),
    scale=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=2)),
    softcap=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none(), st.text(max_size=2)),
    sinks=st.sampled_from(["ok", "nan", "shape", "dtype"]),
)
def test_attention_validation_is_typed(
    cu: list[int], max_q: int | None, scale: object, softcap: object, sinks: str
) -> None:
    q = torch.randn(8, 2, 8)
    cu_t = torch.tensor(cu, dtype=torch.int32)
    s = {
        "ok": torch.zeros(1, 2),
        "nan": torch.tensor([[0.0, math.nan]]),
        "shape": torch.zeros(1, 3),
        "dtype": torch.zeros(1, 2, dtype=torch.float64),
    }[sinks]
    try:
        m2.attention(
            q,
            q,
            q,
            cu_t,
            cu_t,
            max_seqlen_q=max_q,
            softmax_scale=scale,
            softcap=softcap,  # type: ignore[arg-type]
            sinks=s,
        )
    except m2.InvalidInputError:
        return
    # accepted: then every argument was valid
    assert cu[0] == 0 and cu[-1] == 8 and all(b >= a for a, b in itertools.pairwise(cu))
    assert sinks == "ok" and isinstance(softcap, float) and math.isfinite(softcap)


# -- rmsnorm ---------------------------------------------------------------------------------------------------
@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    sizes=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    d=st.integers(1, 33),
    patterns=st.sampled_from([1, 2]),
    dtype=DTYPES,
    out=st.sampled_from([None, torch.float32]),
    contiguous=st.booleans(),
    scale=st.sampled_from([1.0, 1e-20, 1e25]),
)
def test_rmsnorm_agrees_with_the_oracle(
    seed: int,
    sizes: list[int],
    d: int,
    patterns: int,
    dtype: torch.dtype,
    out: torch.dtype | None,
    contiguous: bool,
    scale: float,
) -> None:
    t = sum(sizes)
    shape = (t, patterns, d) if patterns > 1 else (t, d)
    if dtype == torch.float16 and scale != 1.0:
        scale = 1.0  # outside FP16's range
    x = _tensor(seed, shape, dtype, contiguous=contiguous, scale=scale)
    w = _tensor(seed + 1, (len(sizes), patterns, d), torch.float32, scale=0.1)
    y = m2.rmsnorm(x, w, modality_sizes=sizes, out_dtype=out)
    expected = oracles.rmsnorm(x, w, modality_sizes=sizes).to(out or dtype)
    assert y.shape == x.shape and y.dtype == (out or dtype)
    assert accept_rmsnorm(y, expected), accept_rmsnorm(y, expected)


@SETTINGS
@given(
    eps=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.none(), st.text(max_size=2), st.booleans()),
    sizes=st.one_of(st.none(), st.lists(st.integers(-1, 4), max_size=3)),
)
def test_rmsnorm_validation_is_typed(eps: Any, sizes: list[int] | None) -> None:
    x = torch.randn(4, 8)
    w = torch.randn(1 if sizes is None else max(len(sizes), 1), 1, 8)
    try:
        m2.rmsnorm(x, w, eps=eps, modality_sizes=sizes)
    except m2.InvalidInputError:
        return
    assert isinstance(eps, float) and math.isfinite(eps) and eps >= 0
    assert sizes is None or (sum(sizes) == 4 and min(sizes) >= 0 and len(sizes) >= 1)


@SETTINGS
@given(seed=st.integers(0, 2**16), rows=st.integers(2, 6), bad=st.sampled_from([math.nan, math.inf]))
def test_rmsnorm_non_finite_rows_stay_in_their_row(seed: int, rows: int, bad: float) -> None:
    x = _tensor(seed, (rows, 16), torch.float32)
    w = _tensor(seed + 1, (1, 1, 16), torch.float32)
    clean = m2.rmsnorm(x, w)
    x[1, 3] = bad
    y = m2.rmsnorm(x, w)
    assert torch.equal(y[0], clean[0]) and torch.equal(y[2:], clean[2:])
    assert not bool(torch.isfinite(y[1]).all())


# -- moe ---------------------------------------------------------------------------------------------------------
@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    t=st.integers(0, 6),
    hl=st.sampled_from([1, 2]),
    e=st.sampled_from([4, 8]),
    k=st.integers(1, 4),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    bias=st.booleans(),
    contiguous=st.booleans(),
)
def test_moe_route_agrees_with_the_oracle(
    seed: int, t: int, hl: int, e: int, k: int, dtype: torch.dtype, bias: bool, contiguous: bool
) -> None:
    d = 8
    x = _tensor(seed, (t, hl, d), dtype, contiguous=contiguous, scale=2.0)
    w = _tensor(seed + 1, (hl * e, d), torch.float32, scale=d**-0.5)
    b = _tensor(seed + 2, (hl * e,), torch.float32, scale=0.05) if bias else None
    probs, idx = m2.moe_route(x, w, b, top_k=k, route_scale=4.9)
    assert probs.shape == idx.shape == (hl, t, k)
    verdict = accept_moe_route(
        probs, idx, route_truth(x, w, b, top_k=k, route_scale=4.9, route_norm=True, score_func="sigmoid")
    )
    assert verdict, str(verdict)


@SETTINGS
@given(
    top_k=st.one_of(st.integers(-1, 10), st.booleans(), st.floats(allow_nan=True)),
    scale=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=2), st.none()),
    bias=st.sampled_from(["none", "ok", "nan", "inf", "shape"]),
)
def test_moe_route_validation_is_typed(top_k: Any, scale: Any, bias: str) -> None:
    x, w = torch.randn(3, 2, 8), torch.randn(8, 8)
    b = {
        "none": None,
        "ok": torch.zeros(8),
        "nan": torch.full((8,), math.nan),
        "inf": torch.full((8,), math.inf),
        "shape": torch.zeros(4),
    }[bias]
    try:
        m2.moe_route(x, w, b, top_k=top_k, route_scale=scale)
    except m2.InvalidInputError:
        return
    assert isinstance(top_k, int) and not isinstance(top_k, bool) and 1 <= top_k <= 4
    assert isinstance(scale, float) and math.isfinite(scale) and bias in ("none", "ok", "inf")  # inf: upstream's


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    t=st.integers(0, 5),
    hl=st.sampled_from([1, 2]),
    k=st.integers(1, 2),
    contiguous=st.booleans(),
)
def test_moe_experts_agree_with_the_oracle(seed: int, t: int, hl: int, k: int, contiguous: bool) -> None:
    d, inter, e = 8, 16, 4
    x = _tensor(seed, (t, hl, d), torch.bfloat16, contiguous=contiguous)
    w = _tensor(seed + 1, (hl * e, d), torch.float32, scale=d**-0.5)
    probs, idx = m2.moe_route(x, w, None, top_k=k)
    wg = _tensor(seed + 2, (hl * e, d, inter), torch.bfloat16, scale=d**-0.5)
    wu = _tensor(seed + 3, (hl * e, d, inter), torch.bfloat16, scale=d**-0.5)
    wd = _tensor(seed + 4, (hl * e, inter, d), torch.bfloat16, scale=inter**-0.5)
    y = m2.moe_experts(x, probs, idx, wg, wu, wd)
    expected = oracles.moe_experts(x, probs, idx, wg, wu, wd, rounding="schedule").to(torch.bfloat16)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert accept_moe_experts(y, expected, inter), accept_moe_experts(y, expected, inter)


@SETTINGS
@given(shift=st.integers(-6, 6), dtype=st.sampled_from([torch.int64, torch.int32, torch.float32]))
def test_moe_experts_validation_of_host_ids(shift: int, dtype: torch.dtype) -> None:
    x = torch.randn(3, 1, 8).to(torch.bfloat16)
    probs = torch.rand(1, 3, 2)
    idx = (torch.tensor([[[0, 1], [2, 3], [1, 0]]]) + shift).to(dtype)
    wg = wu = torch.randn(4, 8, 16).to(torch.bfloat16)
    wd = torch.randn(4, 16, 8).to(torch.bfloat16)
    try:
        m2.moe_experts(x, probs, idx, wg, wu, wd)
    except m2.InvalidInputError:
        return
    assert dtype != torch.float32 and 0 <= int(idx.min()) and int(idx.max()) < 4
