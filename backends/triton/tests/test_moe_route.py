"""The ``triton`` ``moe_route`` provider (torch scores + one selection kernel): the reference's expert ids
exactly, and the routing contract against the float64 truth.

CPU: the selection kernel runs under TRITON_INTERPRET=1. GPU (`gpu` marker): production-local
shapes. Ids are compared for equality with the reference provider (ties included: both order equal
scores by expert id: the same torch scores) and held to the routing contract (``accept_moe_route``);
weights within 1e-6 of the float64 oracle where no two selection scores are within FP32 rounding.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from magi2_backend_reference.moe import exact_moe_route
from magi2_backend_triton.moe_route import select_routes, triton_moe_route

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_moe_route, route_truth
from magi2_core.testing import call_record
from magi2_core.testing.specials import ROUTE_SPECIALS, RouteSpecial, route_specials

# The float64 oracles live with the core tests of this monorepo.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
import oracles

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _inputs(
    t: int, hl: int, e: int, d: int, dtype: torch.dtype, seed: int, bias: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, hl, d, generator=g) * 2.0).to(dtype)
    w = torch.randn(hl * e, d, generator=g) / d**0.5
    b = torch.randn(hl * e, generator=g) * 0.05 if bias else None
    return x.to(DEVICE), w.to(DEVICE), None if b is None else b.to(DEVICE)


def _opts(**kw: object) -> dict[str, object]:
    return {"top_k": 6, "route_scale": 4.9, "route_norm": True, "score_func": "sigmoid"} | kw


def _both(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, **kw: object
) -> tuple[tuple[torch.Tensor, ...], ...]:
    opts = _opts(**kw)
    return triton_moe_route(call_record("moe_route", x, w, b, **opts)), exact_moe_route(x, w, b, **opts)  # type: ignore[arg-type]


def _truth(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, **kw: object):  # type: ignore[no-untyped-def]
    return route_truth(x, w, b, **_opts(**kw))  # type: ignore[arg-type]


def _distinct_rows(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, score_func: str) -> torch.Tensor:
    """[Hl, T] mask of rows whose float64 selection scores are pairwise further apart than FP32 rounding."""
    hl, d = x.shape[1], x.shape[2]
    e = w.shape[0] // hl
    z = torch.einsum("thd,hed->hte", x.double().cpu(), w.double().cpu().view(hl, e, d))
    s = torch.sigmoid(z) if score_func == "sigmoid" else torch.softmax(z, dim=-1)
    sel = s if b is None else s + b.double().cpu().view(hl, 1, e)
    srt = sel.sort(dim=-1).values
    return (srt.diff(dim=-1).abs() > 1e-5 * srt[..., 1:].abs().clamp_min(1e-30)).all(dim=-1)


CASES = [(0, 3, 8, 16, 6), (1, 1, 4, 8, 2), (37, 2, 8, 32, 3), (19, 3, 16, 24, 6), (9, 2, 5, 12, 5), (11, 1, 12, 8, 12)]


@pytest.mark.parametrize(("t", "hl", "e", "d", "k"), CASES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
@pytest.mark.parametrize("route_norm", [True, False], ids=["norm", "no-norm"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
def test_matches_reference_and_oracle(
    t: int, hl: int, e: int, d: int, k: int, dtype: torch.dtype, score_func: str, route_norm: bool, with_bias: bool
) -> None:
    x, w, b = _inputs(t, hl, e, d, dtype, seed=t * 31 + e, bias=with_bias)
    (probs, idx), (_ref_p, ref_i) = _both(x, w, b, top_k=k, route_norm=route_norm, score_func=score_func)
    assert probs.dtype == torch.float32 and idx.dtype == torch.int64 and probs.shape == (hl, t, k)
    assert torch.equal(idx, ref_i)
    verdict = accept_moe_route(probs, idx, _truth(x, w, b, top_k=k, route_norm=route_norm, score_func=score_func))
    assert verdict, str(verdict)
    or_p, or_i = oracles.moe_route(x, w, b, top_k=k, route_scale=4.9, route_norm=route_norm, score_func=score_func)
    ok = _distinct_rows(x, w, b, score_func)
    assert torch.equal(idx.cpu()[ok], or_i[ok])
    assert torch.allclose(probs.double().cpu()[ok], or_p[ok], rtol=1e-6, atol=1e-6)


def test_ties_follow_the_expert_id_like_the_reference() -> None:
    """Deliberate exact ties, inside the top-k and across its boundary, and saturated scores."""
    hl, e, d, k = 2, 16, 8, 5
    g = torch.Generator().manual_seed(7)
    x = torch.randn(13, hl, d, generator=g)
    w = torch.randn(hl * e, d, generator=g) / d**0.5
    w[[3, 9, 12]] = w[6].clone()  # head 0: experts 3, 6, 9, 12 score identically on every token
    w[e + 4] = w[e + 1] * 40.0  # head 1: saturated sigmoid (exactly 1.0) on many tokens
    w[e + 11] = w[e + 1] * 50.0
    bias = torch.zeros(hl * e)
    bias[[3, 6, 9, 12]] = 2.0  # the tied experts win the first slots; a fifth competes at the boundary
    x, w, bias = x.to(DEVICE), w.to(DEVICE), bias.to(DEVICE)
    (probs, idx), (_ref_p, ref_i) = _both(x, w, bias, top_k=k)
    assert torch.equal(idx, ref_i)
    assert idx[0, :, :4].cpu().tolist() == [[3, 6, 9, 12]] * 13  # equal scores in expert-id order
    assert accept_moe_route(probs, idx, _truth(x, w, bias, top_k=k))
    sat = (idx[1, :, :2].cpu() == torch.tensor([4, 11])).all(dim=-1)
    assert bool(sat.any())  # the saturated pair really tied at 1.0 somewhere, and 4 came first


def test_special_values_rank_like_the_reference_sort() -> None:
    """NaN ranks highest, -0.0 ties +0.0, -inf lowest: select_routes on hand-made scores."""
    nan, inf = float("nan"), float("inf")
    scores = torch.tensor([[[0.5, nan, -0.0, 0.0, -inf, 0.5, inf, -1.0]]], device=DEVICE)
    probs, idx = select_routes(scores, None, top_k=8, route_scale=1.0, route_norm=False)
    assert idx.cpu().tolist() == [[[1, 6, 0, 5, 2, 3, 7, 4]]]
    ref = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    assert torch.equal(idx, ref)
    torch.testing.assert_close(probs, torch.gather(scores, -1, idx), equal_nan=True, rtol=0, atol=0)


def test_bias_selects_but_never_weights() -> None:
    x, w, _ = _inputs(9, 2, 8, 16, torch.bfloat16, seed=3)
    bias = torch.zeros(16, device=DEVICE)
    bias[[1, 14]] = 10.0
    probs, idx = triton_moe_route(
        call_record("moe_route", x, w, bias, top_k=3, route_scale=1.0, route_norm=True, score_func="sigmoid")
    )
    assert bool((idx[0, :, 0] == 1).all()) and bool((idx[1, :, 0] == 6).all())
    assert float(probs[0, :, 0].max()) < 0.9


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
@pytest.mark.parametrize("kind", ROUTE_SPECIALS)
def test_non_finite_inputs_route_like_the_reference(kind: RouteSpecial, score_func: str, dtype: torch.dtype) -> None:
    """Upstream's non-finite routes (±inf bias, exhausted heads, NaN logits), through the public op."""
    x, w, b = _inputs(13, 3, 8, 16, dtype, seed=61)
    assert b is not None
    x, b = route_specials(kind, x, b, top_k=3)
    probs, idx = m2.moe_route(x, w, b, top_k=3, score_func=score_func, provider="triton")
    ref_p, ref_i = m2.moe_route(x, w, b, top_k=3, score_func=score_func, provider="reference")
    assert torch.equal(idx, ref_i), (idx, ref_i)  # the same ids, ties and NaN included
    assert torch.equal(probs.isnan(), ref_p.isnan())
    verdict = accept_moe_route(probs, idx, _truth(x, w, b, top_k=3, score_func=score_func))
    assert verdict, str(verdict)
    assert all(len(set(r)) == 3 for r in idx.reshape(-1, 3).tolist()) and bool(((idx >= 0) & (idx < 8)).all())


@gpu
@needs_cuda
@pytest.mark.parametrize("kind", ROUTE_SPECIALS)
def test_production_shape_non_finite_inputs_route_like_the_reference(kind: RouteSpecial) -> None:
    x, w, b = _inputs(4096, 3, 256, 256, torch.bfloat16, seed=62)
    assert b is not None
    x, b = route_specials(kind, x, b, top_k=6)
    (probs, idx), (ref_p, ref_i) = _both(x, w, b)
    assert torch.equal(idx, ref_i), f"{int((idx != ref_i).sum())} ids differ"
    assert torch.equal(probs.isnan(), ref_p.isnan())
    verdict = accept_moe_route(probs, idx, _truth(x, w, b))
    assert verdict, str(verdict)


@gpu
@needs_cuda
@pytest.mark.parametrize("t", [1, 512, 4096, 14601])
@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
def test_production_shape_ids_equal_the_reference(t: int, score_func: str) -> None:
    x, w, b = _inputs(t, 3, 256, 256, torch.bfloat16, seed=t)
    (probs, idx), (_ref_p, ref_i) = _both(x, w, b, score_func=score_func)
    assert torch.equal(idx, ref_i), f"{int((idx != ref_i).sum())} ids differ"
    verdict = accept_moe_route(probs, idx, _truth(x, w, b, score_func=score_func))
    assert verdict, str(verdict)
