"""``magi2_core.moe_route`` / ``moe_experts`` on CPU (reference provider) against the float64 oracles.

Routing: ids equal, probabilities within 1e-6 of the float64 value. Experts: the contract rule of
``accept_moe_experts`` against the oracle's emulation of the operators.md §3.4 rounding schedule, and much
tighter than it (the only differences left are FP32-vs-float64 sums that land across a BF16
rounding midpoint); and against the unrounded float64 math at the accuracy BF16 storage allows.
"""

from __future__ import annotations

import oracles
import pytest
import torch

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_moe_experts, accept_moe_route, rel_l2, route_truth


def _router(hl: int, e: int, d: int, *, bias: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    w = torch.randn(hl * e, d) / d**0.5
    return w, (torch.randn(hl * e) * 0.05 if bias else None)


def _experts(
    hl: int, e: int, d: int, inter: int, dtype: torch.dtype = torch.bfloat16, gain: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    wg = (torch.randn(hl * e, d, inter) * gain / d**0.5).to(dtype)
    wu = (torch.randn(hl * e, d, inter) * gain / d**0.5).to(dtype)
    wd = (torch.randn(hl * e, inter, d) / inter**0.5).to(dtype)
    return wg, wu, wd


# ---------------------------------------------------------------------------------------------
# routing
# ---------------------------------------------------------------------------------------------
ROUTE_SHAPES = [(0, 3, 16, 8, 6), (1, 1, 8, 4, 2), (7, 3, 24, 8, 6), (33, 2, 40, 16, 4), (5, 4, 12, 5, 5)]


@pytest.mark.parametrize(("t", "hl", "d", "e", "k"), ROUTE_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "nobias"])
def test_route_matches_oracle(
    seed: int, make: oracles.MakeTensor, t: int, hl: int, d: int, e: int, k: int, dtype: torch.dtype, with_bias: bool
) -> None:
    x = make((t, hl, d), dtype, scale=2.0, contiguous=seed % 2 == 0)
    w, b = _router(hl, e, d, bias=with_bias)
    probs, idx = m2.moe_route(x, w, b, top_k=k, route_scale=4.9)
    ref_p, ref_i = oracles.moe_route(x, w, b, top_k=k, route_scale=4.9)
    assert probs.dtype == torch.float32 and probs.shape == (hl, t, k) and idx.shape == (hl, t, k)
    assert torch.equal(idx.long(), ref_i)
    assert torch.allclose(probs.double(), ref_p, rtol=0, atol=1e-6)
    verdict = accept_moe_route(
        probs, idx, route_truth(x, w, b, top_k=k, route_scale=4.9, route_norm=True, score_func="sigmoid")
    )
    assert verdict, str(verdict)
    if t:  # weights sum to route_scale (all sigmoid scores are positive)
        assert torch.allclose(probs.double().sum(-1), torch.full((hl, t), 4.9, dtype=torch.float64), atol=1e-5)


def test_bias_selects_but_never_weights(make: oracles.MakeTensor) -> None:
    t, hl, d, e, k = 9, 2, 16, 8, 3
    x = make((t, hl, d), torch.bfloat16)
    w, _ = _router(hl, e, d)
    bias = torch.zeros(hl * e)
    bias[[1, e + 6]] = 10.0  # expert 1 of head 0 and expert 6 of head 1 win every selection
    probs, idx = m2.moe_route(x, w, bias, top_k=k, route_scale=1.0)
    assert bool((idx[0, :, 0] == 1).all()) and bool((idx[1, :, 0] == 6).all())
    ref_p, ref_i = oracles.moe_route(x, w, bias, top_k=k, route_scale=1.0)
    assert torch.equal(idx.long(), ref_i) and torch.allclose(probs.double(), ref_p, atol=1e-6)
    # the weight of the forced expert is its unbiased score, normalised: never near 1 from the bias
    assert float(probs[0, :, 0].max()) < 0.9


@pytest.mark.parametrize("route_scale", [1.0, 2.5, 0.0])
def test_route_scale_multiplies(make: oracles.MakeTensor, route_scale: float) -> None:
    x = make((6, 2, 8))
    w, b = _router(2, 6, 8)
    probs, idx = m2.moe_route(x, w, b, top_k=3, route_scale=route_scale)
    ref_p, ref_i = oracles.moe_route(x, w, b, top_k=3, route_scale=route_scale)
    assert torch.equal(idx.long(), ref_i) and torch.allclose(probs.double(), ref_p, rtol=0, atol=1e-6)


def test_ties_inside_the_top_k_keep_the_set_and_weights() -> None:
    """Tie order is torch.topk's; what the contract fixes is the selected set and each one's weight."""
    hl, e, d, k = 1, 8, 4, 4
    x = torch.randn(3, hl, d)
    w = torch.randn(hl * e, d)
    w[[2, 5]] = w[0].clone()  # experts 0, 2, 5 score identically on every token
    bias = torch.zeros(hl * e)
    bias[[0, 2, 5]] = 5.0  # and all three are selected
    probs, idx = m2.moe_route(x, w, bias, top_k=k, route_scale=4.9)
    ref_p, ref_i = oracles.moe_route(x, w, bias, top_k=k, route_scale=4.9)
    for tok in range(3):
        got = dict(zip(idx[0, tok].tolist(), probs[0, tok].tolist(), strict=True))
        want = dict(zip(ref_i[0, tok].tolist(), ref_p[0, tok].tolist(), strict=True))
        assert set(got) == set(want) and {0, 2, 5} <= set(got)
        for j in want:
            assert abs(got[j] - want[j]) <= 1e-6


# ---------------------------------------------------------------------------------------------
# experts
# ---------------------------------------------------------------------------------------------
# (T, Hl, d, I, K, E): the upstream parity shapes at reduced width, T = 0 and T = 1 included
EXPERT_SHAPES = [
    (0, 3, 32, 48, 2, 4),
    (1, 1, 64, 80, 2, 4),
    (17, 3, 64, 80, 2, 4),
    (13, 2, 48, 96, 3, 8),
    (5, 2, 32, 1280, 6, 8),
]


def _routes(x: torch.Tensor, e: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    w, b = _router(x.shape[1], e, x.shape[2])
    return m2.moe_route(x, w, b, top_k=k)


@pytest.mark.parametrize(("t", "hl", "d", "inter", "k", "e"), EXPERT_SHAPES, ids=lambda v: str(v))
def test_experts_match_the_rounding_schedule(
    seed: int, make: oracles.MakeTensor, t: int, hl: int, d: int, inter: int, k: int, e: int
) -> None:
    x = make((t, hl, d), torch.bfloat16, contiguous=seed != 3)
    probs, idx = _routes(x, e, k)
    if seed == 17:
        idx = idx.to(torch.int32)
    ws = _experts(hl, e, d, inter)
    y = m2.moe_experts(x, probs, idx, *ws)
    assert y.dtype == torch.bfloat16 and y.shape == (t, hl, d)
    sched = oracles.moe_experts(x, probs, idx, *ws, rounding="schedule")
    verdict = accept_moe_experts(y, sched.to(torch.bfloat16), inter)
    assert verdict, str(verdict)
    if t == 0:
        return
    # tighter: only midpoint crossings of FP32-vs-float64 sums remain
    assert rel_l2(y, sched) < 5e-4
    assert float((y.double() == sched).double().mean()) > 0.95
    # against the unrounded float64 math: BF16 intermediate + K BF16 routes + one BF16 sum
    exact = oracles.moe_experts(x, probs, idx, *ws, rounding="none")
    assert rel_l2(y, exact) < 1e-2


def test_experts_in_fp32_follow_float64_math(make: oracles.MakeTensor) -> None:
    t, hl, d, inter, k, e = 11, 2, 24, 40, 3, 6
    x = make((t, hl, d), torch.float32)
    probs, idx = _routes(x, e, k)
    ws = _experts(hl, e, d, inter, torch.float32)
    y = m2.moe_experts(x, probs, idx, *ws)
    assert y.dtype == torch.float32
    exact = oracles.moe_experts(x, probs, idx, *ws, rounding="none")
    assert torch.allclose(y.double(), exact, rtol=1e-5, atol=1e-6)


def test_reference_keeps_fp32_gate_up_until_activation(make: oracles.MakeTensor) -> None:
    """operators.md §3.4 (upstream #7206 test): rounding the projections to BF16 before SwiGLU7 would change the
    result."""
    t, hl, d, inter, k, e = 24, 2, 64, 96, 2, 4
    x = make((t, hl, d), torch.bfloat16, scale=2.0)
    probs, idx = _routes(x, e, k)
    ws = _experts(hl, e, d, inter, gain=2.0)  # |g|, |u| of a few units: BF16 rounding of them is visible
    y = m2.moe_experts(x, probs, idx, *ws)
    sched = oracles.moe_experts(x, probs, idx, *ws, rounding="schedule")
    early = oracles.moe_experts(x, probs, idx, *ws, rounding="early")
    near, far = rel_l2(y, sched), rel_l2(y, early)
    assert far > 1e-3 and far > 10 * near, f"schedule {near:.3g} vs early rounding {far:.3g}"
    assert int((y.double() != early).sum()) > int((y.double() != sched).sum())


def test_unused_experts_are_never_read(make: oracles.MakeTensor) -> None:
    """An expert with no tokens may hold anything (here NaN): the output must not see it."""
    t, hl, d, inter, k, e = 10, 2, 32, 48, 2, 6
    x = make((t, hl, d), torch.bfloat16)
    probs = torch.rand(hl, t, k) + 0.1
    idx = torch.randint(0, 3, (hl, t, k))  # experts 3..5 of every head receive no token
    wg, wu, wd = _experts(hl, e, d, inter)
    for h in range(hl):
        for w in (wg, wu, wd):
            w[h * e + 3 : (h + 1) * e] = float("nan")
    y = m2.moe_experts(x, probs, idx, wg, wu, wd)
    assert bool(torch.isfinite(y).all())
    clean = [w.clone() for w in (wg, wu, wd)]
    for w in clean:
        w.nan_to_num_(0.0)
    sched = oracles.moe_experts(x, probs, idx, *clean, rounding="schedule")
    assert accept_moe_experts(y, sched.to(torch.bfloat16), inter)


def test_head_without_weighted_routes_is_zero(make: oracles.MakeTensor) -> None:
    """A head whose routes all carry weight 0 contributes exactly 0; the other heads are unaffected."""
    t, hl, d, inter, k, e = 8, 3, 32, 48, 2, 4
    x = make((t, hl, d), torch.bfloat16)
    probs, idx = _routes(x, e, k)
    probs = probs.clone()
    probs[1] = 0.0
    ws = _experts(hl, e, d, inter)
    y = m2.moe_experts(x, probs, idx, *ws)
    assert torch.equal(y[:, 1], torch.zeros(t, d, dtype=torch.bfloat16))
    sched = oracles.moe_experts(x, probs, idx, *ws, rounding="schedule")
    assert accept_moe_experts(y, sched.to(torch.bfloat16), inter)
    assert float(y[:, [0, 2]].abs().max()) > 0


def test_route_weight_applies_after_the_down_projection(make: oracles.MakeTensor) -> None:
    """Doubling every weight doubles each FP32 route before its BF16 store: exactly 2x in BF16."""
    t, hl, d, inter, k, e = 6, 2, 32, 48, 1, 4
    x = make((t, hl, d), torch.bfloat16)
    probs, idx = _routes(x, e, k)
    ws = _experts(hl, e, d, inter)
    y1 = m2.moe_experts(x, probs, idx, *ws)
    y2 = m2.moe_experts(x, probs * 2, idx, *ws)
    assert torch.equal(y2, y1 * 2)


def test_moe_inputs_are_not_mutated(make: oracles.MakeTensor) -> None:
    x = make((5, 2, 16), torch.bfloat16)
    probs, idx = _routes(x, 4, 2)
    ws = _experts(2, 4, 16, 24)
    before = [a.clone() for a in (x, probs, idx, *ws)]
    m2.moe_experts(x, probs, idx, *ws)
    for a, b in zip((x, probs, idx, *ws), before, strict=True):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# routing options: softmax scores, no normalisation
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
@pytest.mark.parametrize("route_norm", [True, False], ids=["norm", "no-norm"])
def test_route_options_match_oracle(make: oracles.MakeTensor, score_func: str, route_norm: bool) -> None:
    x = make((23, 3, 16), torch.bfloat16, scale=2.0)
    w, b = _router(3, 8, 16)
    probs, idx = m2.moe_route(x, w, b, top_k=4, route_scale=2.5, route_norm=route_norm, score_func=score_func)  # type: ignore[arg-type]
    ref_p, ref_i = oracles.moe_route(x, w, b, top_k=4, route_scale=2.5, route_norm=route_norm, score_func=score_func)  # type: ignore[arg-type]
    assert torch.equal(idx.long(), ref_i)
    assert torch.allclose(probs.double(), ref_p, rtol=0, atol=1e-6)
    sums = probs.double().sum(-1)
    if route_norm:
        assert torch.allclose(sums, torch.full_like(sums, 2.5), atol=1e-5)
    else:  # unnormalised weights are route_scale times raw scores: their sum is not route_scale
        assert not torch.allclose(sums, torch.full_like(sums, 2.5), atol=1e-3)


def test_route_equal_scores_in_expert_id_order() -> None:
    """The contract pins ties: equal selection scores come in ascending expert id (torch.topk does not)."""
    x = torch.randn(5, 1, 4)
    w = torch.randn(8, 4)
    w[[0, 1, 2, 4, 6, 7]] = 0.0  # six experts with logit exactly 0: equal scores sigmoid(0) = 0.5
    probs, idx = m2.moe_route(x, w, None, top_k=6, route_scale=1.0)
    ref_p, ref_i = oracles.moe_route(x, w, None, top_k=6, route_scale=1.0)
    assert torch.equal(idx.long(), ref_i) and torch.allclose(probs.double(), ref_p, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("kw", "arg"), [({"score_func": "relu"}, "score_func"), ({"route_norm": 1}, "route_norm")])
def test_route_rejects_unknown_options(kw: dict[str, object], arg: str) -> None:
    with pytest.raises(m2.InvalidValueError) as err:
        m2.moe_route(torch.randn(3, 1, 4), torch.randn(4, 4), None, top_k=2, **kw)  # type: ignore[arg-type]
    assert err.value.arg == arg
