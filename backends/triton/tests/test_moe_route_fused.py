"""The ``triton_fused`` ``moe_route`` provider: one kernel per head group, held to the routing contract.

CPU: the kernel runs under TRITON_INTERPRET=1 on small shapes, against the float64 truth
(``accept_moe_route``): planted near-ties, exact ties, +-inf bias, NaN logits, softmax,
route_norm=False, FP16/FP32 activations, E not a power of two, d not a multiple of 16, T = 0 and 1.
Under the interpreter the kernel walks the experts in chunks of 16, so every test with E > 16 selects
among several chunks' candidates; the chunk tests below plant exact ties across chunk boundaries, a -inf
bias that exhausts a head across chunks, and NaN rows. GPU (`gpu`
marker): production shapes against the float64 truth, every candidate config, CUDA-graph replay,
torch.compile(fullgraph=True) and run-to-run bit equality.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from magi2_backend_reference.moe import exact_moe_route
from magi2_backend_triton.moe_route_fused import (
    CANDIDATES,
    DEFAULTS,
    SHARED_BUDGET,
    RouteConfig,
    fused_route,
)

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_moe_route, route_truth, tally_route_ids
from magi2_core.testing.route import plant_near_ties

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _inputs(
    t: int, hl: int, e: int, d: int, dtype: torch.dtype = torch.bfloat16, seed: int = 0, bias: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, hl, d, generator=g).to(dtype)
    w = torch.randn(hl * e, d, generator=g) / d**0.5
    b = torch.randn(hl * e, generator=g) * 0.1 if bias else None
    return x.to(DEVICE), w.to(DEVICE), None if b is None else b.to(DEVICE)


def _opts(**kw: object) -> dict[str, object]:
    return {"top_k": 6, "route_scale": 4.9, "route_norm": True, "score_func": "sigmoid"} | kw


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal (NaN included)."""
    return a.dtype == b.dtype and torch.equal(
        a.view(torch.int32) if a.is_floating_point() else a, b.view(torch.int32) if b.is_floating_point() else b
    )


def _check(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, config: RouteConfig | None = None, **kw: object
) -> tuple[torch.Tensor, ...]:
    """Route with the kernel, hold it to the contract."""
    opts = _opts(**kw)
    probs, idx = fused_route(x, w, b, config=config, **opts)  # type: ignore[arg-type]
    assert probs.dtype == torch.float32 and idx.dtype == torch.int64
    assert probs.shape == idx.shape == (x.shape[1], x.shape[0], opts["top_k"])
    truth = route_truth(x, w, b, **opts)  # type: ignore[arg-type]
    verdict = accept_moe_route(probs, idx, truth)
    assert verdict, str(verdict)
    return probs, idx, truth  # type: ignore[return-value]


# (t, hl, e, d, k): E a power of two or not, d a multiple of 16 or not, T = 1
SHAPES = [(37, 2, 8, 32, 3), (9, 3, 12, 24, 5), (1, 1, 64, 16, 6)]


@pytest.mark.parametrize(("t", "hl", "e", "d", "k"), SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
def test_contract_against_the_float64_truth(
    t: int, hl: int, e: int, d: int, k: int, dtype: torch.dtype, score_func: str
) -> None:
    x, w, b = _inputs(t, hl, e, d, dtype, seed=t + e)
    _check(x, w, b, top_k=k, score_func=score_func)


@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
def test_no_norm_and_no_bias(score_func: str) -> None:
    x, w, b = _inputs(21, 2, 16, 32, seed=5, bias=False)
    probs, _, _ = _check(x, w, b, top_k=4, route_norm=False, route_scale=2.0, score_func=score_func)
    assert float(probs.sum(-1).max()) < 2.0 * (4 if score_func == "sigmoid" else 1)


def test_planted_near_ties_both_clauses() -> None:
    x, w, b = _inputs(48, 2, 16, 32, seed=11)
    w, b = plant_near_ties(torch.Generator().manual_seed(3), w, b, num_heads=2)
    _, idx, truth = _check(x, w.to(DEVICE), None if b is None else b.to(DEVICE), top_k=4)
    tally = tally_route_ids(idx, truth)
    assert tally.clear_rows > 0 and tally.near_tie_rows > 0 and tally.clear_rows_wrong == 0


def test_exact_ties_go_to_the_lowest_id() -> None:
    hl, e, d, k = 2, 16, 32, 5
    x, w, _ = _inputs(13, hl, e, d, torch.float32, seed=7)
    w = w.clone()
    w[[3, 9, 12]] = w[6].clone()  # head 0: experts 3, 6, 9, 12 score identically on every token
    w[e + 4] = w[e + 1] * 40.0  # head 1: saturated sigmoid (exactly 1.0 in FP32) on many tokens
    w[e + 11] = w[e + 1] * 50.0
    bias = torch.zeros(hl * e, device=DEVICE)
    bias[[3, 6, 9, 12]] = 2.0  # the tied experts win the first four places
    _probs, idx, _ = _check(x, w, bias, top_k=k)
    assert idx[0, :, :4].cpu().tolist() == [[3, 6, 9, 12]] * 13
    sat = (idx[1, :, :2].cpu() == torch.tensor([4, 11])).all(dim=-1)
    assert bool(sat.any())  # the saturated pair tied at 1.0 in FP32 somewhere, and 4 came first
    _ref_p, ref_i = exact_moe_route(x, w, bias, **_opts(top_k=k))  # type: ignore[arg-type]
    assert torch.equal(idx, ref_i)  # FP32 ties: the reference's stable sort agrees


# x0 and the router value w_a of expert a, and expert b's logit c: a's FP32 logit x0 * w_a lies below c only
# when the last BF16 term of the split (of w for BF16 x, of x for FP16/FP32 x) is in the dot.
LAST_TERM = [
    (torch.bfloat16, 1.0, -(8 + 2**-5 + 2**-19), -(8 + 2**-5 + 2**-20)),
    (torch.float16, 1 + 2**-10, -16.0, -(16 + 2**-7)),
    (torch.float32, 1 + 2**-9 + 2**-20, -16.0, -(16 + 2**-5 + 2**-17)),
]


@pytest.mark.parametrize(
    ("dtype", "x0", "w_a", "c"), LAST_TERM, ids=lambda v: str(v) if isinstance(v, torch.dtype) else ""
)
def test_every_bit_of_weight_and_activation_counts(dtype: torch.dtype, x0: float, w_a: float, c: float) -> None:
    """FP32-exact products: a near-tie the contract leaves free, that only an exact split decides."""
    e, d = 4, 16
    x = torch.zeros(1, 1, d, dtype=dtype)
    x[0, 0, 0], x[0, 0, 1] = x0, 1.0
    assert float(x[0, 0, 0]) == x0  # representable in the activation dtype
    w = torch.zeros(e, d)
    w[:, 1] = -40.0  # experts 2, 3: far below
    w[0, 0], w[0, 1] = w_a, 0.0  # expert 0 = a: logit x0 * w_a
    w[1, 1] = c  # expert 1 = b: logit c
    assert x0 * w_a < c  # exactly (Python floats are float64): b's logit is the larger
    _probs, idx = fused_route(x.to(DEVICE), w.to(DEVICE), None, **_opts(top_k=2))  # type: ignore[arg-type]
    assert idx[0, 0].tolist() == [1, 0]


def test_infinite_bias_selects_first_or_never() -> None:
    t, e, k = 9, 12, 5
    x, w, _ = _inputs(t, 2, e, 32, seed=2)
    inf = float("inf")
    bias = torch.zeros(2 * e)
    bias[[2, 9]] = inf  # head 0: two experts always first, the lower id first
    bias[[0, 5]] = -inf  # head 0: never chosen (enough finite experts)
    bias[e:] = -inf  # head 1: only experts 1 and 3 finite: the rest of each row is -inf experts, lowest id first
    bias[e + 1] = bias[e + 3] = 0.0
    bias = bias.to(DEVICE)
    probs, idx, _ = _check(x, w, bias, top_k=k)
    ids0, ids1 = idx[0].cpu(), idx[1].cpu()
    assert (ids0[:, :2] == torch.tensor([2, 9])).all()
    assert not bool(((ids0 == 0) | (ids0 == 5)).any())
    assert (ids1[:, 2:] == torch.tensor([0, 2, 4])).all()  # exhausted: -inf experts in ascending id
    assert sorted(ids1[0, :2].tolist()) == [1, 3]
    assert bool(torch.isfinite(probs).all())  # the bias never reaches a weight
    for row in idx.reshape(-1, k).cpu().tolist():
        assert len(set(row)) == k and all(0 <= i < e for i in row)


def test_nan_logits_rank_first_and_stay_in_their_row() -> None:
    x, w, b = _inputs(8, 2, 8, 32, seed=4)
    clean_p, clean_i = fused_route(x, w, b, **_opts(top_k=3))  # type: ignore[arg-type]
    x = x.clone()
    x[5, 1, 7] = float("nan")
    probs, idx, _ = _check(x, w, b, top_k=3)
    assert idx[1, 5].tolist() == [0, 1, 2] and bool(probs[1, 5].isnan().all())
    keep = torch.ones(2, 8, dtype=torch.bool)
    keep[1, 5] = False
    assert torch.equal(idx[keep], clean_i[keep]) and torch.equal(probs[keep], clean_p[keep])


def test_empty_input() -> None:
    x, w, b = _inputs(0, 3, 8, 16)
    probs, idx = fused_route(x, w, b, **_opts(top_k=2))  # type: ignore[arg-type]
    assert probs.shape == idx.shape == (3, 0, 2)


@pytest.mark.parametrize(
    "config",
    [RouteConfig(16, 16, 16, 4, 1), RouteConfig(64, 32, 32, 8, 2, split_acc=False), RouteConfig(32, 64, 32, 4, 2)],
    ids=lambda c: c.name,
)
def test_configs_give_the_contract(config: RouteConfig) -> None:
    x, w, b = _inputs(20, 2, 40, 48, seed=9)  # 40 experts: 3 chunks of 16, 2 of 32, 1 of 64
    probs, idx = fused_route(x, w, b, config=config, **_opts(top_k=3))  # type: ignore[arg-type]
    verdict = accept_moe_route(probs, idx, route_truth(x, w, b, **_opts(top_k=3)))  # type: ignore[arg-type]
    assert verdict, str(verdict)


def test_every_config_fits_the_shared_memory_and_the_dot() -> None:
    for cfg in {*CANDIDATES, *(c for _, c in DEFAULTS)}:
        assert cfg.shared_bytes(torch.bfloat16) <= SHARED_BUDGET, cfg  # as listed, for the release's BF16 x
        for dtype in (torch.float16, torch.float32):  # what fused_route launches for the others
            fitted = cfg.fitted(dtype)
            assert fitted.shared_bytes(dtype) <= SHARED_BUDGET and fitted.block_d >= 16, (cfg, dtype)
        assert cfg.block_t >= 16 and cfg.block_n >= 16 and cfg.block_d >= 16 and cfg.num_warps in (4, 8), cfg
        assert cfg.registers() <= 64, cfg  # one [BLOCK_T, BLOCK_N] FP32 tile; the GEMM holds two, the selection three
    assert len({c.name for c in CANDIDATES}) == len(CANDIDATES) and DEFAULTS[-1][0] is None


def test_the_budget_check_is_not_vacuous() -> None:
    big = RouteConfig(128, 256, 64, 8, 3)
    assert big.shared_bytes(torch.bfloat16) > SHARED_BUDGET
    assert big.fitted(torch.float32).block_d < 64


# ---------------------------------------------------------------------------------------------
# the chunk merge: E over several chunks of 16 (the interpreter's chunk, and an explicit config)
# ---------------------------------------------------------------------------------------------
CHUNKED = RouteConfig(32, 16, 16, 4, 1)


@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_chunks_against_the_float64_truth(score_func: str, dtype: torch.dtype) -> None:
    x, w, b = _inputs(23, 2, 52, 32, dtype, seed=21)  # 4 chunks, the last one 4 experts wide
    for config in (None, CHUNKED):
        _check(x, w, b, top_k=6, score_func=score_func, config=config)


@pytest.mark.parametrize("k", [20, 37, 40])
def test_top_k_wider_than_a_chunk(k: int) -> None:
    """More winners than a chunk has experts: the running top-k holds slots with nothing real in them
    until later chunks fill them (k = E: every expert, the whole order)."""
    x, w, b = _inputs(7, 2, 40, 32, seed=k)
    for config in (None, CHUNKED):
        probs, idx, _ = _check(x, w, b, top_k=k, config=config)
        for row in idx.reshape(-1, k).cpu().tolist():
            assert len(set(row)) == k and all(0 <= i < 40 for i in row)
        assert bool(torch.isfinite(probs).all())


def test_exact_ties_across_chunk_boundaries_go_to_the_lowest_id() -> None:
    e, k = 48, 6
    x, w, _ = _inputs(17, 1, e, 32, torch.float32, seed=8)
    w = w.clone()
    twins = [5, 15, 16, 31, 32, 47]  # one each side of both boundaries, and the first and last chunks
    w[twins] = w[40].clone()
    bias = torch.zeros(e, device=DEVICE)
    bias[[*twins, 40]] = 3.0  # the seven tied experts outrank every other one
    for config in (None, CHUNKED):
        _, idx, _ = _check(x, w, bias, top_k=k, config=config)
        assert idx[0].cpu().tolist() == [[5, 15, 16, 31, 32, 40]] * 17


def test_negative_infinite_bias_exhausts_a_head_across_chunks() -> None:
    e, k = 40, 6
    x, w, _ = _inputs(11, 2, e, 32, seed=12)
    inf = float("inf")
    bias = torch.full((2 * e,), -inf)
    bias[[3, 20, 37]] = 0.0  # head 0: three finite experts, one per chunk; the rest -inf
    bias[e:] = 0.0
    bias[e + 17] = inf  # head 1: a +inf bias in the second chunk selects first
    bias[e + 39] = -inf  # and a -inf one in the last chunk never
    bias = bias.to(DEVICE)
    for config in (None, CHUNKED):
        probs, idx, _ = _check(x, w, bias, top_k=k, config=config)
        ids0, ids1 = idx[0].cpu(), idx[1].cpu()
        assert (ids0[:, :3].sort(dim=-1).values == torch.tensor([3, 20, 37])).all()
        assert (ids0[:, 3:] == torch.tensor([0, 1, 2])).all()  # exhausted: the -inf experts, lowest id first
        assert (ids1[:, 0] == 17).all() and not bool((ids1 == 39).any())
        assert bool(torch.isfinite(probs).all())
        for row in idx.reshape(-1, k).cpu().tolist():
            assert len(set(row)) == k and all(0 <= i < e for i in row)


@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
def test_nan_rows_across_chunks(score_func: str) -> None:
    x, w, b = _inputs(9, 2, 40, 32, seed=13)
    opts = _opts(top_k=4, score_func=score_func)
    nan_x = x.clone()
    nan_x[4, 0, 3] = float("nan")
    for config in (None, CHUNKED):
        clean_p, clean_i = fused_route(x, w, b, config=config, **opts)  # type: ignore[arg-type]
        probs, idx = fused_route(nan_x, w, b, config=config, **opts)  # type: ignore[arg-type]
        assert idx[0, 4].tolist() == [0, 1, 2, 3] and bool(probs[0, 4].isnan().all())
        keep = torch.ones(2, 9, dtype=torch.bool)
        keep[0, 4] = False
        assert torch.equal(idx[keep], clean_i[keep]) and torch.equal(probs[keep], clean_p[keep])


@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
def test_the_reduction_of_triples_is_the_max_min_id_selection(score_func: str) -> None:
    """The GPU's selection (one reduction of (key, id, score) triples per winner) against the
    interpreter's (max, min id, one-term sum): bit-equal, ties, -inf bias and NaN rows included, and
    a last chunk of 4 experts (fewer than top_k: its slots repeat ids on removed-key entries)."""
    e, k = 52, 6
    x, w, _ = _inputs(9, 2, e, 32, seed=15)
    w = w.clone()
    w[[5, 16, 31]] = w[20].clone()  # exact ties within and across chunks of 16
    bias = torch.zeros(2 * e)
    bias[[5, 16, 20, 31]] = 2.0
    bias[e : e + 30] = float("-inf")  # head 1: its first 30 experts -inf (they come last, lowest id first)
    x = x.clone()
    x[3, 0, 1] = float("nan")
    for config in (None, CHUNKED, RouteConfig(16, 64, 16, 4, 1)):
        opts = _opts(top_k=k, score_func=score_func)
        triples = fused_route(x, w, bias.to(DEVICE), config=config, _triples=True, **opts)  # type: ignore[arg-type]
        plain = fused_route(x, w, bias.to(DEVICE), config=config, _triples=False, **opts)  # type: ignore[arg-type]
        assert _same(triples[0], plain[0]) and torch.equal(triples[1], plain[1])
        assert triples[1][0, 0, :4].tolist() == [5, 16, 20, 31]


def test_public_op_resolves_to_the_fused_router_and_follows_weight_writes() -> None:
    x, w, b = _inputs(11, 2, 16, 32, seed=6)
    assert m2.resolve("moe_route", x, w, b, top_k=4).chosen == "triton_fused"
    direct = fused_route(x, w, b, **_opts(top_k=4))  # type: ignore[arg-type]
    for got, want in zip(m2.moe_route(x, w, b, top_k=4), direct, strict=True):
        assert torch.equal(got, want)
    w.data.copy_(torch.randn_like(w))  # a write the version counter does not see: the kernel reads w itself
    probs, idx = m2.moe_route(x, w, b, top_k=4)
    assert accept_moe_route(probs, idx, route_truth(x, w, b, **_opts(top_k=4)))  # type: ignore[arg-type]


def test_the_descriptor_leaves_wide_banks_to_the_selection_provider() -> None:
    x, w, b = _inputs(3, 1, 512, 16)
    assert m2.resolve("moe_route", x, w, b, top_k=4).chosen == "triton"


# ---------------------------------------------------------------------------------------------
# GPU: production shapes
# ---------------------------------------------------------------------------------------------
PRODUCTION = [(1, 3), (512, 3), (4096, 3), (14601, 3), (4096, 12)]


def _weights64(x: torch.Tensor, w: torch.Tensor, idx: torch.Tensor, score_func: str) -> torch.Tensor:
    """The float64 weights of the experts ``idx`` names (route_norm, route_scale 4.9)."""
    hl, d = x.shape[1], x.shape[2]
    z = torch.bmm(x.double().permute(1, 0, 2), w.double().view(hl, -1, d).transpose(1, 2))
    s = torch.sigmoid(z) if score_func == "sigmoid" else torch.softmax(z, dim=-1)
    p = s.gather(-1, idx)
    return p / p.abs().sum(-1, keepdim=True) * 4.9


@gpu
@needs_cuda
@pytest.mark.parametrize(("t", "hl"), PRODUCTION, ids=str)
@pytest.mark.parametrize("planted", [False, True], ids=["random", "planted"])
def test_production_contract(t: int, hl: int, planted: bool) -> None:
    x, w, b = _inputs(t, hl, 256, 256, seed=t + hl)
    if planted:
        w, b = plant_near_ties(torch.Generator().manual_seed(t), w, b, num_heads=hl)
        w, b = w.cuda(), None if b is None else b.cuda()
    _, idx, truth = _check(x, w, b)
    tally = tally_route_ids(idx, truth)
    assert tally.clear_rows_wrong == 0 and tally.ok, tally


@gpu
@needs_cuda
@pytest.mark.parametrize(("t", "hl"), PRODUCTION, ids=str)
def test_production_softmax(t: int, hl: int) -> None:
    """Softmax: the ids clause, and weights as close to float64 as the reference's.

    Not the 1e-6 weights clause: at E = 256 two FP32-accurate softmax routes differ by more (CPU
    emulation, 12000 rows: the reference 2.4e-6 from float64, BF16x3 1.9e-6, 3 of 72000 weights
    1.08x over rtol = atol = 1e-6 against each other). docs/moe-notes.md, "the fused router".
    """
    x, w, b = _inputs(t, hl, 256, 256, seed=t + hl)
    probs, idx = fused_route(x, w, b, **_opts(score_func="softmax"))  # type: ignore[arg-type]
    truth = route_truth(x, w, b, **_opts(score_func="softmax"))  # type: ignore[arg-type]
    tally = tally_route_ids(idx, truth)
    assert tally.clear_rows_wrong == 0 and tally.ok, tally
    ref_p, ref_i = exact_moe_route(x, w, b, **_opts(score_func="softmax"))  # type: ignore[arg-type]
    ours = (probs.double() - _weights64(x, w, idx, "softmax")).abs().max()
    theirs = (ref_p.double() - _weights64(x, w, ref_i, "softmax")).abs().max()
    assert float(ours) <= 2 * float(theirs) + 1e-7, (float(ours), float(theirs))


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_production_contract_other_activations(dtype: torch.dtype) -> None:
    x, w, b = _inputs(4096, 3, 256, 256, dtype, seed=1)
    _check(x, w, b)


@gpu
@needs_cuda
@pytest.mark.parametrize("config", CANDIDATES, ids=lambda c: c.name)
def test_every_candidate_config(config: RouteConfig) -> None:
    x, w, b = _inputs(4096, 3, 256, 256, seed=2)
    probs, idx = fused_route(x, w, b, config=config, **_opts())  # type: ignore[arg-type]
    verdict = accept_moe_route(probs, idx, route_truth(x, w, b, **_opts()))  # type: ignore[arg-type]
    assert verdict, str(verdict)


@gpu
@needs_cuda
def test_graph_capture_compile_and_determinism() -> None:
    x, w, b = _inputs(4096, 3, 256, 256, seed=3)
    assert m2.resolve("moe_route", x, w, b, top_k=6).chosen == "triton_fused"
    eager = m2.moe_route(x, w, b)
    again = m2.moe_route(x, w, b)
    assert torch.equal(eager[0], again[0]) and torch.equal(eager[1], again[1])  # deterministic

    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        m2.moe_route(static_x, w, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = m2.moe_route(static_x, w, b)
    x2, _, _ = _inputs(4096, 3, 256, 256, seed=4)
    static_x.copy_(x2)
    graph.replay()
    want = m2.moe_route(x2, w, b)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])

    torch._dynamo.reset()
    compiled = torch.compile(lambda t: m2.moe_route(t, w, b), fullgraph=True)(x)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
