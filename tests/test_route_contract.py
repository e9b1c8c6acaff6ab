"""The routing contract (operators.md §3.2): ids against the float64 truth, weights against the reference.

The rule itself (:func:`accept_moe_route` / :func:`tally_route_ids`) on hand-made rows, and the
conformance kit with deliberately wrong fake providers: a wrong expert or a swapped order on a clear
row FAILS; a reordering inside a near-tie group passes; an exact tie taken out of id order FAILS.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from magi2_backend_reference.moe import exact_moe_route, reference_moe_route

from magi2_core.contracts.acceptance import ROUTE_GAP, accept_moe_route, route_truth, tally_route_ids
from magi2_core.model.capability import Capability
from magi2_core.model.problem import Feature
from magi2_core.ops.moe_route import RouteCall
from magi2_core.testing import registered_backend, run_kit
from magi2_core.testing.route import plant_near_ties

K = 3
KW = {"top_k": K, "route_scale": 4.9, "route_norm": True, "score_func": "sigmoid"}


def _inputs(t: int = 64, hl: int = 2, e: int = 8, d: int = 32, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hl, d, generator=g).bfloat16()
    w = torch.randn(hl * e, d, generator=g) / d**0.5
    b = torch.randn(hl * e, generator=g) * 0.1
    return x, w, b


def _truth(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, **kw: object):  # type: ignore[no-untyped-def]
    return route_truth(x, w, b, **(KW | kw))  # type: ignore[arg-type]


def test_reference_passes_on_random_and_planted_rows() -> None:
    x, w, b = _inputs()
    g = torch.Generator().manual_seed(1)
    for ww, bb in ((w, b), plant_near_ties(g, w, b, num_heads=2)):
        probs, idx = exact_moe_route(x, ww, bb, **KW)  # type: ignore[arg-type]
        truth = _truth(x, ww, bb)
        verdict = accept_moe_route(probs, idx, truth)
        assert verdict, str(verdict)
    tally = tally_route_ids(idx, truth)
    assert tally.clear_rows and tally.near_tie_rows  # the planted rows exercise both clauses


def test_a_wrong_expert_on_a_clear_row_fails() -> None:
    x, w, b = _inputs()
    probs, idx = exact_moe_route(x, w, b, **KW)  # type: ignore[arg-type]
    truth = _truth(x, w, b)
    bad = idx.clone()
    unselected = next(e for e in range(8) if e not in bad[0, 0].tolist())
    bad[0, 0, K - 1] = unselected
    tally = tally_route_ids(bad, truth)
    assert tally.clear_rows_wrong == 1 and tally.group_violations == 1 and not tally.ok
    verdict = accept_moe_route(probs, bad, truth)
    assert not verdict and verdict.metric == "moe_route ids"
    swapped = idx.clone()
    swapped[1, 5, [0, 1]] = idx[1, 5, [1, 0]]
    assert tally_route_ids(swapped, truth).clear_rows_wrong == 1


def test_weights_are_held_to_the_reference_on_the_providers_ids() -> None:
    x, w, b = _inputs()
    probs, idx = exact_moe_route(x, w, b, **KW)  # type: ignore[arg-type]
    truth = _truth(x, w, b)
    off = probs.clone()
    off[0, 3, 1] += 3e-6  # beyond rtol = atol = 1e-6 of a weight below 1
    verdict = accept_moe_route(off, idx, truth)
    assert not verdict and verdict.metric == "moe_route weights"
    near = probs.clone()
    near[0, 3, 1] += 4e-7
    assert accept_moe_route(near, idx, truth)


def _one_row(logits: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """x and a router whose single row of logits is exactly ``logits`` (a one-hot x picks a column)."""
    d, e = 8, len(logits)
    x = torch.zeros(1, 1, d)
    x[0, 0, 0] = 1.0
    w = torch.zeros(e, d)
    w[:, 0] = torch.tensor(logits)
    return x, w


def test_near_tie_groups_may_be_reordered_and_straddle_the_boundary() -> None:
    # sigmoid' ~ 0.2 at 1: experts 2, 3, 1 are a chain 2e-6 apart (within ROUTE_GAP), across place 2
    x, w = _one_row([2.0, 1.0, 1.0 + 2e-5, 1.0 + 1e-5, 0.0, -1.0])
    truth = _truth(x, w, None, top_k=2)
    tally = tally_route_ids(torch.tensor([[[0, 1]]]), truth)
    assert tally.ok and tally.near_tie_rows == 1 and tally.clear_rows == 0
    assert tally_route_ids(torch.tensor([[[0, 3]]]), truth).ok
    assert not tally_route_ids(torch.tensor([[[2, 0]]]), truth).ok  # place 1 is expert 0's alone
    assert not tally_route_ids(torch.tensor([[[0, 4]]]), truth).ok  # 4 is outside the group
    x, w = _one_row([2.0, 1.0, 1.5, 1.2, 0.0, -1.0])  # the same row with clear gaps
    clear = _truth(x, w, None, top_k=2)
    assert tally_route_ids(torch.tensor([[[0, 2]]]), clear).clear_rows == 1
    assert tally_route_ids(torch.tensor([[[2, 0]]]), clear).clear_rows_wrong == 1


def test_exact_ties_go_to_the_lowest_id() -> None:
    x, w, b = _inputs(t=16, hl=1)
    w[[2, 5]] = w[4].clone()  # experts 2, 4, 5 tie exactly on every token
    b[[2, 4, 5]] = 5.0  # and are always the top three
    truth = _truth(x, w, b)
    good = torch.tensor([2, 4, 5]).expand(1, 16, 3)
    assert tally_route_ids(good, truth).ok
    assert tally_route_ids(good[..., [1, 0, 2]], truth).tie_order_violations == 16
    with_k2 = _truth(x, w, b, top_k=2)
    assert tally_route_ids(torch.tensor([2, 5]).expand(1, 16, 2), with_k2).tie_order_violations == 16


def test_non_finite_clause() -> None:
    x, w, b = _inputs(t=8, hl=1)
    x[3, 0, 5] = float("nan")  # all logits of row 3 NaN: NaN ranks first, ties to the lowest id
    b[[1, 6]] = float("-inf")
    b[7] = float("inf")
    truth = _truth(x, w, b)
    probs, idx = exact_moe_route(x, w, b, **KW)  # type: ignore[arg-type]
    assert accept_moe_route(probs, idx, truth)
    assert idx[0, 3].tolist() == [0, 1, 2] and bool(probs[0, 3].isnan().all())
    assert bool((idx[0, [0, 1, 2, 4, 5, 6, 7], 0] == 7).all())  # +inf bias first
    assert not bool((idx[0, [0, 1, 2, 4, 5, 6, 7]] == 1).any())  # -inf never while others remain
    wrong_nan = idx.clone()
    wrong_nan[0, 3] = torch.tensor([0, 2, 1])
    assert not tally_route_ids(wrong_nan, truth).ok
    repeated = idx.clone()
    repeated[0, 0, 2] = repeated[0, 0, 1]
    assert tally_route_ids(repeated, truth).repeated == 1
    out = idx.clone()
    out[0, 0, 2] = 8
    assert tally_route_ids(out, truth).out_of_range == 1
    exhausted = torch.full((8,), float("-inf"))
    exhausted[[0, 4]] = 0.0
    t2 = _truth(x, w, exhausted)
    p2, i2 = exact_moe_route(x, w, exhausted, **KW)  # type: ignore[arg-type]
    assert accept_moe_route(p2, i2, t2) and bool((i2[0, [0, 1, 2, 4, 5, 6, 7], 2] == 1).all())


def test_infinite_x_rows_are_held_to_range_and_distinctness_only() -> None:
    x, w, b = _inputs(t=4, hl=1)
    x[2, 0, 0] = float("inf")
    truth = _truth(x, w, b)
    assert not bool(truth.finite[0, 2]) and not bool(truth.all_nan[0, 2])
    _probs, idx = exact_moe_route(x, w, b, **KW)  # type: ignore[arg-type]
    any_ids = idx.clone()
    any_ids[0, 2] = torch.tensor([7, 3, 5])
    tally = tally_route_ids(any_ids, truth)
    assert tally.ok and tally.nonfinite_rows == 1


# ---------------------------------------------------------------------------------------------
# the kit with deliberately wrong providers
# ---------------------------------------------------------------------------------------------
Fix = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]  # (probs, idx, float64 selection), in place
SWAPS: list[int] = []


def _fake(fix: Fix) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The reference route, then ``fix`` applied to its output."""

    def kernel(call: RouteCall) -> tuple[torch.Tensor, torch.Tensor]:
        probs, idx = reference_moe_route(call)
        probs, idx = probs.clone(), idx.clone()
        truth = route_truth(
            call.x,
            call.router_weight,
            call.bias,
            top_k=call.top_k,
            route_scale=call.route_scale,
            route_norm=call.route_norm,
            score_func=call.score_func,
        )
        fix(probs, idx, truth.selection)
        return probs, idx

    return kernel


def _wrong_on_a_clear_row(probs: torch.Tensor, idx: torch.Tensor, sel: torch.Tensor) -> None:
    """The last expert of the first clear row replaced by one the row did not choose."""
    k, e = idx.shape[2], sel.shape[2]
    if idx.numel() == 0 or k == e:
        return  # nothing left to choose wrongly
    top = torch.sort(sel, dim=-1, descending=True).values[..., : k + 1]
    clear = torch.nonzero(((top[..., :-1] - top[..., 1:]) > ROUTE_GAP).all(dim=-1))
    h, t = clear[0].tolist()
    idx[h, t, -1] = next(x for x in range(e) if x not in idx[h, t].tolist())


def _reorder_near_ties(probs: torch.Tensor, idx: torch.Tensor, sel: torch.Tensor) -> None:
    """Swap every pair of neighbours in the top-k whose scores are near-tied but not equal."""
    s = torch.gather(sel, 2, idx)
    for h, t, j in torch.nonzero((s[..., :-1] != s[..., 1:]) & (s[..., :-1] - s[..., 1:] <= ROUTE_GAP)).tolist():
        if idx[h, t, j] == idx[h, t, j + 1]:
            continue
        for v in (idx, probs):
            v[h, t, [j, j + 1]] = v[h, t, [j + 1, j]].clone()
        SWAPS.append(1)


WRONG = _fake(_wrong_on_a_clear_row)
REORDERED = _fake(_reorder_near_ties)


def _cap(name: str, impl: str) -> Capability:
    return Capability(
        op="moe_route",
        name=name,
        impl=f"{__name__}:{impl}",
        version="0",
        device_types=("cpu",),
        dtypes=("bfloat16",),
        features=frozenset({Feature.ROUTE_SOFTMAX, Feature.ROUTE_NO_NORM}),
        priority=-10,
        description="a deliberately edited reference route",
    )


def test_kit_fails_a_provider_with_a_wrong_expert_on_a_clear_row() -> None:
    with registered_backend(_cap("wrong_route", "WRONG"), name="wrong-route"):
        report = run_kit(["wrong_route"], ops=["moe_route"], devices=["cpu"], seed=0)
    failed = report.failed
    assert failed and all("moe_route ids" in r.report and "clear_rows_wrong" in r.report for r in failed)
    assert {r.case.label for r in failed} >= {"base", "near-ties"}  # type: ignore[union-attr]
    assert any(r.status == "passed" and r.case.id.endswith("top-all") for r in report.results)  # nothing to pick


def test_kit_passes_a_provider_that_reorders_near_ties_only() -> None:
    SWAPS.clear()
    with registered_backend(_cap("reordered_route", "REORDERED"), name="reordered-route"):
        report = run_kit(["reordered_route"], ops=["moe_route"], devices=["cpu"], seed=0)
    assert report.ok, report.format()
    assert SWAPS  # near-tied neighbours were really swapped (the planted ones at least)


@pytest.mark.parametrize("t", [0, 1])
def test_empty_and_single_token_calls(t: int) -> None:
    x, w, b = _inputs(t=t)
    probs, idx = exact_moe_route(x, w, b, **KW)  # type: ignore[arg-type]
    assert accept_moe_route(probs, idx, _truth(x, w, b))
