"""Numerical acceptance rules per operator and dtype (operators.md §2.9, §3.2, §3.8, §4.4, §5.4).

Each rule compares a provider's output with the reference provider's output on the same inputs (the
routing rule: with the float64 truth of the inputs, :func:`route_truth`) and returns an :class:`Acceptance`
(ok, the metric that decided, a readable detail). Tests, the
conformance kit, ``magi2 check`` and shadow verification all use these functions, so a tolerance is
stated once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from magi2_core.contracts.moe import ScoreFunc, router_scores

__all__ = [
    "ATTENTION_TOL",
    "Acceptance",
    "accept_attention",
    "accept_lse",
    "accept_mhc_branch_input",
    "accept_mhc_coefficients",
    "accept_mhc_mix",
    "accept_moe_experts",
    "ROUTE_GAP",
    "ROUTE_WEIGHT_TOL",
    "RouteIdTally",
    "RouteTruth",
    "accept_moe_route",
    "accept_output_gate",
    "accept_rmsnorm",
    "allclose",
    "expected_route_weights",
    "rel_l2",
    "route_truth",
    "tally_route_ids",
    "within_ulps",
]

# (rtol, atol) for attention outputs by activation dtype: upstream MATE/FA3 parity tolerances.
ATTENTION_TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-5, 2e-5),
    torch.bfloat16: (1e-2, 1.5e-2),
    torch.float16: (2e-2, 3e-3),
}
LSE_TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (3e-3, 3e-3),
    torch.float16: (3e-3, 3e-3),
}


@dataclass(frozen=True)
class Acceptance:
    ok: bool
    metric: str
    detail: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.metric}: {self.detail}"


def _shape_mismatch(actual: torch.Tensor, expected: torch.Tensor) -> Acceptance | None:
    if actual.shape != expected.shape:
        return Acceptance(False, "shape", f"got {list(actual.shape)}, expected {list(expected.shape)}")
    if actual.dtype != expected.dtype:
        return Acceptance(False, "dtype", f"got {actual.dtype}, expected {expected.dtype}")
    return None


def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.double().cpu(), expected.double().cpu()
    denom = float(torch.linalg.vector_norm(e))
    num = float(torch.linalg.vector_norm(a - e))
    return num / denom if denom > 0 else num


def allclose(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, what: str) -> Acceptance:
    """``|a - e| <= atol + rtol·|e|`` elementwise; NaN only where the reference has NaN."""
    bad = _shape_mismatch(actual, expected)
    if bad is not None:
        return bad
    a, e = actual.double().cpu(), expected.double().cpu()
    close = torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    n_bad = int((~close).sum())
    if n_bad == 0:
        err = float((a - e).abs().nan_to_num(0.0).max()) if a.numel() else 0.0
        return Acceptance(True, what, f"max |Δ| {err:.3g} within rtol={rtol:g}, atol={atol:g}")
    where = torch.nonzero(~close)[0].tolist()
    return Acceptance(
        False,
        what,
        f"{n_bad}/{a.numel()} outside rtol={rtol:g}, atol={atol:g}; first at {where}: "
        f"got {a[tuple(where)].item():.6g}, expected {e[tuple(where)].item():.6g}",
    )


def within_ulps(actual: torch.Tensor, expected: torch.Tensor, ulps: float = 1.0) -> Acceptance:
    """``|a - e| <=`` ``ulps`` local ULPs of ``e`` in its own dtype: the larger gap to its two neighbours."""
    bad = _shape_mismatch(actual, expected)
    if bad is not None:
        return bad
    e = expected.cpu()
    up = torch.nextafter(e, torch.full_like(e, float("inf"))).double() - e.double()
    down = e.double() - torch.nextafter(e, torch.full_like(e, float("-inf"))).double()
    ulp = torch.maximum(up.nan_to_num(0.0, posinf=0.0), down.nan_to_num(0.0, posinf=0.0))
    a64, e64 = actual.cpu().double(), e.double()
    diff = (a64 - e64).abs()
    same = (a64 == e64) | (a64.isnan() & e64.isnan())
    close = same | (diff <= ulps * ulp)
    n_bad = int((~close).sum())
    if n_bad == 0:
        return Acceptance(True, f"<= {ulps:g} ulp", f"{a64.numel()} values")
    where = torch.nonzero(~close)[0].tolist()
    return Acceptance(
        False,
        f"<= {ulps:g} ulp",
        f"{n_bad}/{a64.numel()} values off; first at {where}: "
        f"got {a64[tuple(where)].item():.8g}, expected {e64[tuple(where)].item():.8g}",
    )


def accept_attention(actual: torch.Tensor, expected: torch.Tensor) -> Acceptance:
    rtol, atol = ATTENTION_TOL[expected.dtype]
    return allclose(actual, expected, rtol, atol, "attention output")


def accept_lse(actual: torch.Tensor, expected: torch.Tensor, activation_dtype: torch.dtype) -> Acceptance:
    rtol, atol = LSE_TOL[activation_dtype]
    return allclose(actual, expected, rtol, atol, "attention lse")


# ---------------------------------------------------------------------------------------------
# moe_route (operators.md §3.2): ids against the float64 truth, weights against the reference's FP32
# ---------------------------------------------------------------------------------------------
ROUTE_GAP = 1e-5
"""Selection scores (float64) closer than this are a near-tie: their order is not promised."""
ROUTE_WEIGHT_TOL = 1e-6
"""rtol = atol of the routing weights against the reference's FP32 weights on the provider's ids."""


@dataclass(frozen=True)
class RouteTruth:
    """What the routing contract compares a provider with, for one call (:func:`route_truth`).

    ``selection``: float64 ``score + bias`` ``[Hl, T, E]`` (logits, sigmoid/softmax and bias in float64;
    experts with bitwise-equal router rows get bitwise-equal logits). ``scores32``: the reference's FP32
    scores (:func:`magi2_core.contracts.moe.router_scores`), from which the expected weights of any
    ids are formed. ``finite`` / ``all_nan`` ``[Hl, T]``: every float64 logit of the row is finite /
    NaN (NaN in x); the other rows (some logits infinite or NaN: an infinite x) are held to the
    non-finite clause only.
    """

    selection: torch.Tensor
    scores32: torch.Tensor
    finite: torch.Tensor
    all_nan: torch.Tensor
    top_k: int
    route_scale: float
    route_norm: bool


def route_truth(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    top_k: int,
    route_scale: float,
    route_norm: bool,
    score_func: ScoreFunc,
) -> RouteTruth:
    """The float64 truth of one ``moe_route`` call, on the inputs' device."""
    t, hl, d = x.shape
    e = router_weight.shape[0] // hl
    w = router_weight.detach().reshape(hl, e, d)
    z = torch.bmm(x.detach().double().permute(1, 0, 2), w.double().transpose(1, 2))
    # A BLAS may sum two equal columns in different orders; equal router rows must tie exactly.
    first = torch.stack([_first_equal_row(w[h]) for h in range(hl)]) if hl else torch.zeros(0, e, dtype=torch.long)
    z = torch.gather(z, 2, first.view(hl, 1, e).expand(hl, t, e))
    s = torch.sigmoid(z) if score_func == "sigmoid" else torch.softmax(z, dim=-1)
    sel = s if bias is None else s + bias.detach().double().view(hl, 1, e)
    finite = torch.isfinite(z).all(dim=-1)
    all_nan = torch.isnan(z).all(dim=-1) & (e > 0)
    scores32 = router_scores(x.detach(), router_weight.detach(), score_func)
    return RouteTruth(sel, scores32, finite, all_nan, top_k, float(route_scale), route_norm)


def _first_equal_row(w: torch.Tensor) -> torch.Tensor:
    """``[E]``: for each row of ``w [E, d]``, the lowest index of a row with the same bits."""
    _, inverse = torch.unique(w.contiguous().view(torch.int32), dim=0, return_inverse=True)
    e = w.shape[0]
    rows = torch.arange(e, device=w.device)
    lowest = torch.full((e,), e, dtype=torch.long, device=w.device).scatter_reduce(0, inverse, rows, "amin")
    return lowest[inverse]


def _ties(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


@dataclass(frozen=True)
class RouteIdTally:
    """The ids clause of the routing contract, counted over (head, token) rows.

    ``clear_rows``: rows whose float64 selection scores among the top k+1 are all more than
    :data:`ROUTE_GAP` apart (their ids must equal the truth's, in order); ``near_tie_rows``: the other
    rows with finite (or all-NaN) logits; ``nonfinite_rows``: rows with some infinite or NaN logits.
    The counts after them are violations (all must be 0): ``clear_rows_wrong`` (a clear row whose ids
    differ from the truth), ``group_violations`` (position j holds an expert outside the near-tie
    group of the truth's j-th expert; includes ``clear_rows_wrong``), ``tie_order_violations`` (an
    expert chosen before, or instead of, a lower-id expert with exactly the same selection score),
    ``out_of_range`` and ``repeated`` (rows with an id outside [0, E) or an expert twice).
    """

    rows: int
    clear_rows: int
    near_tie_rows: int
    nonfinite_rows: int
    clear_rows_wrong: int
    group_violations: int
    tie_order_violations: int
    out_of_range: int
    repeated: int

    @property
    def ok(self) -> bool:
        return not (self.group_violations or self.tie_order_violations or self.out_of_range or self.repeated)

    def as_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.__dict__.items()}


def tally_route_ids(idx: torch.Tensor, truth: RouteTruth) -> RouteIdTally:
    """Count the ids clause over every row (operators.md §3.2: the routing contract).

    Near-tie groups: sort a row's float64 selection scores descending (stable: equal scores in
    ascending expert id, NaN first); consecutive experts whose scores are equal or at most
    :data:`ROUTE_GAP` apart share a group (chains: a group may span more than ROUTE_GAP). Position j of
    the provider's ids must hold an expert of the group of the truth's j-th expert: inside a group any
    order, and any members where a group straddles the k-th place; everywhere else the truth's expert.
    Exact ties (equal float64 scores, equal router rows included) go to the lowest id: a chosen expert's
    lower-id equals must be chosen before it.
    """
    sel = truth.selection
    hl, t, e = sel.shape
    k = truth.top_k
    rows = hl * t
    if rows == 0:
        return RouteIdTally(0, 0, 0, 0, 0, 0, 0, 0, 0)
    sel = sel.reshape(rows, e)
    got = idx.to(sel.device).long().reshape(rows, k)
    checked = (truth.finite | truth.all_nan).reshape(rows)
    out = ((got < 0) | (got >= e)).any(dim=-1)
    srt = torch.sort(got, dim=-1).values
    repeated = (srt[:, 1:] == srt[:, :-1]).any(dim=-1)
    values, order = torch.sort(sel, dim=-1, descending=True, stable=True)
    near = _ties(values[:, 1:], values[:, :-1]) | ((values[:, :-1] - values[:, 1:]) <= ROUTE_GAP)
    m = min(k + 1, e)
    clear = checked & ~near[:, : m - 1].any(dim=-1)
    group = torch.cat([torch.zeros(rows, 1, dtype=torch.long, device=sel.device), (~near).long().cumsum(-1)], -1)
    group_of = torch.empty_like(group).scatter_(1, order, group)  # expert -> its group
    safe = got.clamp(0, max(e - 1, 0))
    wrong_place = (group_of.gather(1, safe) != group[:, :k]).any(dim=-1)
    clear_wrong = clear & (got != order[:, :k]).any(dim=-1)
    # exact ties: for a chosen b, every a < b with sel[a] == sel[b] is chosen at an earlier position
    sb = sel.gather(1, safe)  # [R, K]
    lower_equal = (
        _ties(sel[:, None, :], sb[:, :, None]) & (torch.arange(e, device=sel.device)[None, None, :] < safe[:, :, None])
    ).sum(-1)
    pos = torch.arange(k, device=sel.device)
    earlier = (
        _ties(sb[:, :, None], sb[:, None, :])
        & (safe[:, None, :] < safe[:, :, None])
        & (pos[None, :] < pos[:, None])[None]
    ).sum(-1)
    tie_bad = (lower_equal != earlier).any(dim=-1)
    valid = ~out & ~repeated

    def n(mask: torch.Tensor) -> int:
        return int(mask.sum())

    return RouteIdTally(
        rows=rows,
        clear_rows=n(clear),
        near_tie_rows=n(checked & ~clear),
        nonfinite_rows=n(~checked),
        clear_rows_wrong=n(clear & valid & clear_wrong),
        group_violations=n(checked & valid & wrong_place),
        tie_order_violations=n(checked & valid & tie_bad),
        out_of_range=n(out),
        repeated=n(repeated & ~out),
    )


def expected_route_weights(idx: torch.Tensor, truth: RouteTruth) -> torch.Tensor:
    """The reference's FP32 weights of the experts ``idx`` names: its scores gathered at those ids,
    L1-normalised (eps 1e-12) unless ``route_norm=False``, times ``route_scale`` (ids must be in range)."""
    p = torch.gather(truth.scores32, -1, idx.to(truth.scores32.device).long())
    if truth.route_norm:
        p = p / p.abs().sum(dim=-1, keepdim=True).clamp_min(1e-12)
    return p * truth.route_scale


def accept_moe_route(probs: torch.Tensor, idx: torch.Tensor, truth: RouteTruth) -> Acceptance:
    """The routing contract (operators.md §3.2): the ids clause of :func:`tally_route_ids`, then the
    weights within rtol = atol = 1e-6 of :func:`expected_route_weights` on the provider's own ids, on
    every row with finite (or all-NaN) logits."""
    hl, t, _ = truth.selection.shape
    shape = [hl, t, truth.top_k]
    if list(idx.shape) != shape or list(probs.shape) != shape:
        return Acceptance(
            False, "moe_route shape", f"got probs {list(probs.shape)}, idx {list(idx.shape)}; expected {shape}"
        )
    if probs.dtype != torch.float32:
        return Acceptance(False, "moe_route dtype", f"probs are {probs.dtype}, expected torch.float32")
    tally = tally_route_ids(idx, truth)
    counts = (
        f"{tally.rows} rows: {tally.clear_rows} clear, {tally.near_tie_rows} near-tie, "
        f"{tally.nonfinite_rows} non-finite"
    )
    if not tally.ok:
        bad = {
            k: v
            for k, v in tally.as_dict().items()
            if k in ("clear_rows_wrong", "group_violations", "tie_order_violations", "out_of_range", "repeated") and v
        }
        return Acceptance(False, "moe_route ids", f"{counts}; violations {bad}")
    rows = (truth.finite | truth.all_nan).cpu()
    got = probs.cpu()[rows]
    want = expected_route_weights(idx, truth).cpu()[rows]
    close = allclose(got, want, ROUTE_WEIGHT_TOL, ROUTE_WEIGHT_TOL, "moe_route weights")
    return Acceptance(close.ok, close.metric, f"{counts}; ids within the contract; {close.detail}")


def accept_moe_experts(actual: torch.Tensor, expected: torch.Tensor, intermediate: int) -> Acceptance:
    """Upstream #7206: finite, rel-L2 < 1e-3, elementwise rtol 2e-2 and atol 0.5 (I >= 1024) or 4e-2."""
    bad = _shape_mismatch(actual, expected)
    if bad is not None:
        return bad
    if not bool(torch.isfinite(actual).all()):
        return Acceptance(False, "moe_experts finite", "output has NaN/Inf")
    r = rel_l2(actual, expected)
    if r >= 1e-3:
        return Acceptance(False, "moe_experts rel-L2", f"{r:.3g} >= 1e-3")
    close = allclose(actual, expected, 2e-2, 0.5 if intermediate >= 1024 else 4e-2, "moe_experts")
    return Acceptance(close.ok, "moe_experts", f"rel-L2 {r:.3g}; {close.detail}")


def accept_rmsnorm(actual: torch.Tensor, expected: torch.Tensor) -> Acceptance:
    """FP32: rtol = atol = 1e-6; FP16/BF16: within one local ULP of the reference (#7286)."""
    if expected.dtype == torch.float32:
        return allclose(actual, expected, 1e-6, 1e-6, "rmsnorm fp32")
    return within_ulps(actual, expected, 1.0)


# mHC (operators.md §5.4). The unit roundoff of each stream dtype (half an ULP at 1).
_UNIT_ROUNDOFF: dict[torch.dtype, float] = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}
MHC_COEF_TOL = 1e-5  # FP32 coefficients (post, residual, and the pre coefficients' share of the branch input)


def _local_ulp(e: torch.Tensor) -> torch.Tensor:
    """The larger gap from each value of ``e`` to its two neighbours in its own dtype, as float64."""
    up = torch.nextafter(e, torch.full_like(e, float("inf"))).double() - e.double()
    down = e.double() - torch.nextafter(e, torch.full_like(e, float("-inf"))).double()
    return torch.maximum(up.nan_to_num(0.0, posinf=0.0), down.nan_to_num(0.0, posinf=0.0))


def _within(actual: torch.Tensor, expected: torch.Tensor, tol: torch.Tensor, what: str) -> Acceptance:
    """``|a - e| <= tol`` elementwise (equal values, infinities included, always pass); NaN only where
    the reference has NaN."""
    bad = _shape_mismatch(actual, expected)
    if bad is not None:
        return bad
    a, e = actual.cpu().double(), expected.cpu().double()
    close = (a == e) | (a.isnan() & e.isnan()) | ((a - e).abs() <= tol)
    n_bad = int((~close).sum())
    if n_bad == 0:
        return Acceptance(True, what, f"{a.numel()} values within the bound")
    where = torch.nonzero(~close)[0].tolist()
    return Acceptance(
        False,
        what,
        f"{n_bad}/{a.numel()} values off; first at {where}: got "
        f"{a[tuple(where)].item():.8g}, expected {e[tuple(where)].item():.8g}, "
        f"bound {tol.expand_as(a)[tuple(where)].item():.3g}",
    )


def accept_mhc_branch_input(actual: torch.Tensor, expected: torch.Tensor, streams: torch.Tensor) -> Acceptance:
    """``|a - e| <= ulp(e) + (2u + 1e-5)·Σ_i |streams[:, i]|``: one rounding of the output, and a pre
    coefficient (in (0, 1)) that may round to its neighbour (2u relative, u the streams' unit roundoff)
    or differ by the FP32 logits' error."""
    u = _UNIT_ROUNDOFF[streams.dtype]
    scale = streams.cpu().double().abs().sum(dim=1)
    tol = _local_ulp(expected.cpu()) + (2 * u + MHC_COEF_TOL) * scale.nan_to_num(0.0, posinf=0.0)
    return _within(actual, expected, tol, "mhc_pre branch input")


def accept_mhc_coefficients(actual: torch.Tensor, expected: torch.Tensor, what: str) -> Acceptance:
    """FP32: ``rtol = atol = 1e-5``; BF16/FP16: within one local ULP of the reference."""
    if expected.dtype == torch.float32:
        return allclose(actual, expected, MHC_COEF_TOL, MHC_COEF_TOL, f"mhc_pre {what} fp32")
    close = within_ulps(actual, expected, 1.0)
    return Acceptance(close.ok, f"mhc_pre {what} {close.metric}", close.detail)


def accept_mhc_mix(actual: torch.Tensor, expected: torch.Tensor, call: tuple[Any, ...]) -> Acceptance:
    """``|a - e| <= ulp(e) + 4u·(Σ_j |residual[i, j]·streams[j]| + |post[i]·branch_output|)``: the final
    rounding, and each materialised term rounding to its neighbour (u: the streams' unit roundoff)."""
    streams, branch, post, residual = (t.cpu().double() for t in call[:4])
    u = _UNIT_ROUNDOFF[call[0].dtype]
    mixed = torch.einsum("tij,tjc->tic", residual.abs(), streams.abs())
    scale = mixed + post.abs().unsqueeze(-1) * branch.abs().unsqueeze(1)
    tol = _local_ulp(expected.cpu()) + 4 * u * scale.nan_to_num(0.0, posinf=0.0)
    return _within(actual, expected, tol, "mhc_mix")


# qk_norm_rope: the FP32 chain's error bound, in units of FP32's unit roundoff per term magnitude. The norm
# (sum of squares by a tree of depth log2(D), rsqrt within 2 ULP, two scalings), the two products and
# their sum come to about 10u of |n_i·cos| + |n_partner·sin|; 16u leaves room for FMA contraction.
QK_NORM_ROPE_TERMS_U = 16


def _qk_norm_rope_scale(call: Any) -> torch.Tensor:
    """Per output element ``|n_i·cos| + |n_partner·sin|`` (``|n_i|`` past the rotated dims) in float64."""
    x: torch.Tensor = call.x.cpu().double()
    weight: torch.Tensor = call.weight.cpu()
    rope: torch.Tensor = call.rope.cpu().double().abs()
    sizes = call.modality_sizes
    t = x.shape[0]
    scale = (weight + 1).double()
    rows = scale[0].expand(t, -1) if sizes is None else torch.repeat_interleave(scale, torch.tensor(sizes), dim=0)
    n = x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + call.eps) * rows.unsqueeze(1)
    if call.index is not None:
        n = n.index_select(0, call.index.cpu().long())
    n = n.abs()
    half = rope.shape[1] // 2
    sin, cos = rope[:, None, :half], rope[:, None, half : 2 * half]
    lo, hi = n[..., :half], n[..., half : 2 * half]
    out = n.clone()
    out[..., :half] = lo * cos + hi * sin
    out[..., half : 2 * half] = hi * cos + lo * sin
    return out


def accept_qk_norm_rope(actual: torch.Tensor, expected: torch.Tensor, call: Any) -> Acceptance:
    """``|a - e| <= ulp(e) + 16u·(|n_i·cos| + |n_partner·sin|)``: the output's one rounding, and the FP32
    chain's error on each term (u = 2**-24; n the exact normalised, scaled row)."""
    tol = _local_ulp(expected.cpu()) + QK_NORM_ROPE_TERMS_U * 2.0**-24 * _qk_norm_rope_scale(call).nan_to_num(
        0.0, posinf=0.0
    )
    return _within(actual, expected, tol, "qk_norm_rope")


# output_gate, in units of FP32's unit roundoff u of |y|: the product's rounding and a division (2u), an exp
# within a few ULP (4u), and the exp's argument g·log2(e) rounded (|g|·u relative in the result; 2|g|u
# leaves room for an exp2-based one). Below FP32's smallest normal number a GPU's exp and product may
# flush to zero: that much absolute error is allowed too.
OUTPUT_GATE_U = 8
FP32_TINY = 2.0**-126


def accept_output_gate(actual: torch.Tensor, expected: torch.Tensor, gate: torch.Tensor) -> Acceptance:
    """``|a - e| <= ulp(e) + (8 + 2|g|)·u·|e| + 2**-126`` per element: the output's one rounding, the FP32
    sigmoid and product of the element's gate logit g (u = 2**-24), and a flush of FP32 subnormals,
    against the float64 reference rounded to the output's dtype."""
    e = expected.cpu()
    g = gate.cpu().double().reshape(e.shape[0], e.shape[1], 1).abs().nan_to_num(0.0, posinf=0.0)
    rel = (OUTPUT_GATE_U + 2.0 * g) * 2.0**-24
    tol = _local_ulp(e) + rel * e.double().abs().nan_to_num(0.0, posinf=0.0) + FP32_TINY
    return _within(actual, expected, tol, "output_gate")
