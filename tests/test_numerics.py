"""Decisions on bad values, pinned (docs/numerics.md): typed errors for
non-numeric scalars, meta tensors and gradients; NaN parameters rejected on the host; overflow
defined; rules see the true longest segment; compiled fakes match what the kernels return; the
device index is part of the problem."""

from __future__ import annotations

import copy
import types

import oracles
import pytest
import torch

import magi2_core as m2
from magi2_core import Capability, Condition, Problem, Rule
from magi2_core.contracts import acceptance as acc
from magi2_core.contracts.acceptance import accept_moe_route, route_truth
from magi2_core.model.capability import Provenance
from magi2_core.ops.attention import SPEC as ATTENTION
from magi2_core.ops.attention import AttentionCall, AttentionKey
from magi2_core.ops.attention import validate as validate_attention
from magi2_core.selection.dispatch import Dispatcher
from magi2_core.selection.registry import Registry
from magi2_core.testing.specials import ROUTE_SPECIALS, RouteSpecial, route_specials

INF = float("inf")


def _attn_inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(10, 2, 8, generator=g) for _ in range(3))
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    return q, k, v, cu, cu


def _route_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(5, 2, 8, generator=g), torch.randn(8, 8, generator=g), torch.randn(8, generator=g) * 0.1


# -- defect 10: non-numeric scalars and meta tensors raise typed errors naming the argument ------------------
@pytest.mark.parametrize(
    ("call", "arg"),
    [
        (lambda: m2.attention(*_attn_inputs(), softcap="abc"), "softcap"),  # type: ignore[arg-type]
        (lambda: m2.attention(*_attn_inputs(), softmax_scale="x"), "softmax_scale"),  # type: ignore[arg-type]
        (lambda: m2.attention(*_attn_inputs(), softcap=None), "softcap"),  # type: ignore[arg-type]
        (lambda: m2.rmsnorm(torch.randn(2, 4), torch.randn(1, 1, 4), eps=None), "eps"),  # type: ignore[arg-type]
        (lambda: m2.rmsnorm(torch.randn(2, 4), torch.randn(1, 1, 4), eps=True), "eps"),  # type: ignore[arg-type]
        (lambda: m2.moe_route(*_route_inputs(), top_k=2, route_scale="a"), "route_scale"),  # type: ignore[arg-type]
    ],
)
def test_non_numeric_scalars_raise_typed_errors(call: object, arg: str) -> None:
    with pytest.raises(m2.InvalidValueError) as info:
        call()  # type: ignore[operator]
    assert info.value.arg == arg


def test_use_with_a_non_string_name_is_a_typed_error() -> None:
    with (
        pytest.raises(m2.InvalidValueError, match="'attention' must be a provider name"),
        m2.use(attention=["reference"]),
    ):  # type: ignore[arg-type]
        pass


def test_meta_tensors_are_rejected_before_any_kernel() -> None:
    q = torch.empty(10, 2, 8, device="meta")
    cu = torch.tensor([0, 10], dtype=torch.int32)
    with pytest.raises(m2.InvalidDeviceError, match="meta"):
        m2.attention(q, q, q, cu, cu, max_seqlen_q=10, max_seqlen_k=10)
    with pytest.raises(m2.InvalidDeviceError, match="meta"):
        m2.rmsnorm(torch.empty(3, 4, device="meta"), torch.empty(1, 1, 4, device="meta"))
    with pytest.raises(m2.InvalidDeviceError, match="meta"):
        m2.moe_route(torch.empty(5, 2, 8, device="meta"), torch.empty(8, 8, device="meta"), None, top_k=2)


# -- defect 5: NaN parameters, overflow, eps = 0 ---------------------------------------------------------------
def test_nan_sinks_on_the_host_are_rejected_infinite_ones_accepted() -> None:
    sinks = torch.tensor([[0.5, float("nan")]])
    with pytest.raises(m2.InvalidValueError, match=r"'sinks' must be values without NaN.*1 NaN of 2"):
        m2.attention(*_attn_inputs(), sinks=sinks)
    o = m2.attention(*_attn_inputs(), sinks=torch.tensor([[float("inf"), float("-inf")]]))
    assert bool((o[:, 0] == 0).all()) and torch.equal(o[:, 1], m2.attention(*_attn_inputs())[:, 1])


def test_nan_router_bias_on_the_host_is_rejected_infinite_accepted() -> None:
    x, w, b = _route_inputs()
    b[3] = float("nan")
    with pytest.raises(m2.InvalidValueError, match="'bias' must be values without NaN") as err:
        m2.moe_route(x, w, b, top_k=2)
    assert err.value.arg == "bias"
    b[3], b[5] = float("inf"), float("-inf")
    _, idx = m2.moe_route(x, w, b, top_k=2)
    assert bool((idx[0, :, 0] == 3).all()) and not bool((idx[1] == 1).any())  # bias 5 = head 1, expert 1


# -- a cached call layout still checks host sinks and router bias: writes that leave _version alone ---------
def _nan_writes() -> list[tuple[str, object]]:
    def copy(t: torch.Tensor) -> None:
        t.data.copy_(torch.full_like(t, float("nan")))

    def assign(t: torch.Tensor) -> None:
        t.data = torch.full_like(t, float("nan"))

    def numpy(t: torch.Tensor) -> None:
        t.numpy()[...] = float("nan")

    return [("data.copy_", copy), ("data =", assign), ("numpy", numpy)]


@pytest.mark.parametrize(("how", "write"), _nan_writes(), ids=[w[0] for w in _nan_writes()])
def test_writes_behind_the_version_counter_are_caught(how: str, write: object) -> None:
    if how == "numpy":
        pytest.importorskip("numpy")
    q, k, v, cu, _ = _attn_inputs(4)
    sinks = torch.randn(1, 2)
    m2.attention(q, k, v, cu, cu, sinks=sinks)
    m2.attention(q, k, v, cu, cu, sinks=sinks)  # a cached layout, sinks found NaN-free
    version = sinks._version
    write(sinks)  # type: ignore[operator]
    assert sinks._version == version or how == "data ="  # the counter cannot tell
    with pytest.raises(m2.InvalidValueError, match="'sinks' must be values without NaN"):
        m2.attention(q, k, v, cu, cu, sinks=sinks)
    x, w, bias = _route_inputs()
    m2.moe_route(x, w, bias, top_k=2)
    m2.moe_route(x, w, bias, top_k=2)
    write(bias)  # type: ignore[operator]
    with pytest.raises(m2.InvalidValueError, match="'bias' must be values without NaN"):
        m2.moe_route(x, w, bias, top_k=2)


# -- non-finite router inputs follow upstream (torch.topk on score + bias) -------------------------------------
@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
@pytest.mark.parametrize("kind", ROUTE_SPECIALS)
def test_non_finite_routes_follow_upstream(score_func: str, kind: RouteSpecial) -> None:
    g = torch.Generator().manual_seed(5)
    t, hl, e, k = 9, 2, 8, 3
    x = torch.randn(t, hl, 16, generator=g)
    w = torch.randn(hl * e, 16, generator=g) / 4
    bias = torch.randn(hl * e, generator=g) * 0.1
    x, bias = route_specials(kind, x, bias, top_k=k)
    probs, idx = m2.moe_route(x, w, bias, top_k=k, score_func=score_func, provider="reference")
    ref_p, ref_i = oracles.moe_route(x, w, bias, top_k=k, route_scale=4.9, score_func=score_func)
    assert torch.equal(idx, ref_i) and torch.equal(probs.isnan(), ref_p.isnan())
    verdict = accept_moe_route(
        probs, idx, route_truth(x, w, bias, top_k=k, route_scale=4.9, route_norm=True, score_func=score_func)
    )  # type: ignore[arg-type]
    assert verdict, str(verdict)
    assert bool(((idx >= 0) & (idx < e)).all())
    assert all(len(set(row)) == k for row in idx.reshape(-1, k).tolist())  # distinct experts per route
    # upstream: torch.topk(score + bias); its order of equal values is unspecified, ours ascending id
    logits = torch.einsum("thd,hed->hte", x, w.view(hl, e, 16))
    scores = torch.sigmoid(logits) if score_func == "sigmoid" else torch.softmax(logits, dim=-1)
    select = scores + bias.view(hl, 1, e)
    upstream = torch.topk(select, k, dim=-1).indices
    picked = select.gather(-1, idx).sort(dim=-1).values
    torch.testing.assert_close(
        picked, select.gather(-1, upstream).sort(dim=-1).values, rtol=0, atol=0, equal_nan=True
    )  # the same selected values: ties are the only freedom
    chosen = select.gather(-1, idx)
    special = {
        "neg_inf_bias": not bool((chosen == -INF).any()),
        "exhausted": bool((chosen[0, :, -1] == -INF).all()),
        "pos_inf_bias": idx[-1, :, :2].tolist() == [[1, e - 1]] * t,
        "nan_logits": bool(chosen.isnan().any()),
    }
    assert special[kind], (kind, idx)
    for row, ids in zip(select.reshape(-1, e), idx.reshape(-1, k), strict=True):
        chose_neg_inf = bool((row[ids] == -INF).any())
        assert not chose_neg_inf or int((row != -INF).sum()) < k  # a -inf expert only fills an exhausted row
        nan = torch.nonzero(row.isnan()).flatten()[:k]
        assert ids[: nan.numel()].tolist() == nan.tolist()  # NaN first, in id order


def test_eps_zero_makes_an_all_zero_row_nan_and_nothing_else() -> None:
    x = torch.randn(3, 8)
    x[1] = 0.0
    w = torch.randn(1, 1, 8)
    out = m2.rmsnorm(x, w, eps=0.0)  # 0/0: NaN, by definition (never a finite zero row)
    assert bool(out[1].isnan().all()) and bool(torch.isfinite(out[0]).all() and torch.isfinite(out[2]).all())
    with pytest.raises(m2.InvalidValueError, match="'eps' must be a finite float >= 0"):
        m2.rmsnorm(x, w, eps=-1e-6)


@pytest.mark.parametrize(
    ("shape", "weight_shape", "sizes"),
    [
        ((3, 0), (1, 1, 0), None),
        ((0, 0), (1, 1, 0), None),
        ((0, 4), (2, 1, 4), [0, 0]),
        ((4, 3, 0), (2, 3, 0), [1, 3]),
        ((5, 2, 0), (0,), [2, 3]),
        ((0, 2, 3, 0), (1, 3, 0), None),
    ],
    ids=["width0", "t0-width0", "t0-modalities", "patterns-width0", "flat-weight-width0", "4d-t0-width0"],
)
@pytest.mark.parametrize("provider", [None, "reference"])
def test_rmsnorm_of_an_empty_input_is_the_empty_result(
    shape: tuple[int, ...], weight_shape: tuple[int, ...], sizes: list[int] | None, provider: str | None
) -> None:
    """As upstream (mean over an empty width is NaN, times nothing): the empty result, never a crash."""
    x = torch.randn(shape, dtype=torch.bfloat16)
    w = torch.randn(weight_shape)
    for out_dtype in (None, torch.float32):
        y = m2.rmsnorm(x, w, modality_sizes=sizes, out_dtype=out_dtype, provider=provider)
        assert y.shape == x.shape and y.dtype == (out_dtype or x.dtype) and y.numel() == 0


def test_reference_rmsnorm_does_not_overflow_to_zeros() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 64, generator=g) * 1e30
    x[1] = torch.randn(64, generator=g)  # an ordinary row beside the huge ones keeps its bits
    w = torch.randn(1, 1, 64, generator=g)
    out = m2.rmsnorm(x, w, provider="reference")
    expected = oracles.rmsnorm(x, w)
    assert oracles.ulps_off(out, expected, ulps=4) is None
    assert torch.equal(out[1], m2.rmsnorm(x[1:2], w, provider="reference")[0])


def test_attention_scores_overflowing_fp32_give_nan_not_a_finite_answer() -> None:
    q, k, v, cu, _ = _attn_inputs(2)
    out = m2.attention(q * 1e20, k * 1e20, v, cu, cu, provider="reference")
    assert bool(out.isnan().all())


# -- reference attention: softmax divides by the row sum ------------------------------------------------------
def test_equal_scores_weigh_every_key_exactly() -> None:
    for keys in (1, 3, 5, 7, 96):
        q = torch.zeros(4, 2, 8)
        k = torch.randn(keys, 2, 8)
        v = torch.ones(keys, 2, 8)
        cu_q, cu_k = torch.tensor([0, 4]), torch.tensor([0, keys])
        out = m2.attention(q, k, v, cu_q, cu_k, provider="reference")
        assert bool((out == 1.0).all()), keys


# -- defect 6: gradients are refused, never dropped -----------------------------------------------------------
def test_inputs_that_require_grad_raise() -> None:
    x, w = torch.randn(3, 8, requires_grad=True), torch.randn(1, 1, 8)
    with pytest.raises(m2.InvalidValueError, match="'x' must be a tensor that does not require grad"):
        m2.rmsnorm(x, w)
    q, k, v, cu, _ = _attn_inputs()
    with pytest.raises(m2.InvalidValueError, match=r"'k'.*forward-only"):
        m2.attention(q, k.requires_grad_(), v, cu, cu)
    xr, wr, b = _route_inputs()
    with pytest.raises(m2.InvalidValueError, match="'router_weight'"):
        m2.moe_route(xr, wr.requires_grad_(), b, top_k=2)
    with torch.no_grad():
        assert m2.rmsnorm(x, w).shape == (3, 8)  # under no_grad (or inference_mode) the same call runs
    assert m2.rmsnorm(x.detach(), w).requires_grad is False


# -- defect 7: compiled fakes describe what the kernels return, for non-contiguous inputs ---------------------
def _noncontiguous_block(
    x: torch.Tensor,
    w: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    router: torch.Tensor,
    wg: torch.Tensor,
    wu: torch.Tensor,
    wd: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    h = m2.rmsnorm(x, w)
    o = m2.attention(q, k, v, cu, cu, max_seqlen_q=5, max_seqlen_k=5)
    p, i = m2.moe_route(x, router, None, top_k=2)
    y = m2.moe_experts(x, p, i, wg, wu, wd)
    return h * 2, o * 2, y * 2  # consumers, so that inductor relies on the declared strides


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_with_non_contiguous_inputs(backend: str) -> None:
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(11)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x = r(2, 9, 16).transpose(0, 1)  # [9, 2, 16], non-contiguous
    q, k, v = (r(4, 9, 16).transpose(0, 1) for _ in range(3))
    args = (x, r(1, 1, 16) * 0.1, q, k[:, :2], v[:, :2], r(8, 16), r(8, 16, 32) / 4, r(8, 16, 32) / 4, r(8, 32, 16) / 4)
    assert not x.is_contiguous() and not q.is_contiguous()
    eager = _noncontiguous_block(*args)
    compiled = torch.compile(_noncontiguous_block, fullgraph=True, backend=backend)(*args)
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# -- defect 4: rules judge the true longest segment of host prefix sums ---------------------------------------
class _Tag:
    def __init__(self, tag: float) -> None:
        self.tag = tag

    def __call__(self, call: AttentionCall) -> tuple[torch.Tensor, None]:
        return torch.full_like(call.q, self.tag), None


def test_rule_sees_the_true_longest_segment(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("magi2_short_rule_kernels")
    mod.tag = _Tag(5.0)  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, mod.__name__, mod)
    rule = Rule(
        id="short",
        when=(Condition(field="max_seqlen_q", op="lt", value=32),),
        reason="too short",
        provenance=Provenance(kind="policy", source="test"),
    )
    cap = Capability(
        op="attention",
        name="long_only",
        impl="magi2_short_rule_kernels:tag",
        device_types=("cpu",),
        dtypes=("float32",),
        features=frozenset({m2.Feature.GQA}),
        priority=10_000,
        rules=(rule,),
    )
    from magi2_core.testing import registered_backend

    q = torch.randn(32, 2, 8)
    cu = torch.tensor([0, 16, 32], dtype=torch.int32)  # 16-token segments
    with registered_backend(cap, name="short-rule"):
        out = m2.attention(q, q, q, cu, cu, max_seqlen_q=64, max_seqlen_k=64)  # a generous declared bound
        assert not bool((out == 5.0).all())  # the rule fired on 16, not on the declared 64
        res = m2.resolve("attention", q, q, q, cu, cu, max_seqlen_q=64, max_seqlen_k=64)
        assert res.problem.max_seqlen_q == 16 and res.chosen != "long_only"
        assert "declared bound" in res.explain()
        long_cu = torch.tensor([0, 32], dtype=torch.int32)
        assert bool((m2.attention(q, q, q, long_cu, long_cu) == 5.0).all())  # and it does run at 32


# -- defect 13: the device index is part of the problem and of the cache key ----------------------------------
def test_device_index_is_in_the_problem_and_the_key() -> None:
    key = validate_attention(
        *_attn_inputs(),
        max_seqlen_q=None,
        max_seqlen_k=None,
        softmax_scale=None,
        softcap=0.0,
        sinks=None,
        sink_rescale="fp32",
        deterministic=False,
        return_lse=False,
        compiling=False,
    ).key
    problem = ATTENTION.problem(key)
    assert (problem.device_type, problem.device_index) == ("cpu", None)
    on = [key._replace(device=torch.device("cuda", i)) for i in (0, 1)]
    problems = [ATTENTION.problem(k) for k in on]
    assert [p.device_index for p in problems] == [0, 1]
    assert on[0][:4] != on[1][:4]  # the dispatcher keys on the head (device, dtypes, features): another entry


def test_dispatcher_caches_per_device() -> None:
    disp = Dispatcher(Registry())
    base = validate_attention(
        *_attn_inputs(),
        max_seqlen_q=None,
        max_seqlen_k=None,
        softmax_scale=None,
        softcap=0.0,
        sinks=None,
        sink_rescale="fp32",
        deterministic=False,
        return_lse=False,
        compiling=False,
    ).key
    built: list[Problem] = []

    def problem(key: AttentionKey) -> Problem:
        problem = ATTENTION.problem(key)
        built.append(problem)
        return problem.model_copy(update={"device_type": "cpu"})

    recording = copy.copy(ATTENTION)  # the op's spec, its problems recorded
    recording.problem = problem  # type: ignore[method-assign]
    for device in (torch.device("cpu"), torch.device("cpu", 0), torch.device("cpu")):
        disp.kernel(recording, base._replace(device=device), None)
    assert [p.device_index for p in built] == [None, 0]  # the third call hit the first one's entry


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nan_device_sinks_and_bias_are_checked_only_with_device_value_checks() -> None:
    q, k, v, cu, _ = (t.cuda() for t in _attn_inputs(6))
    nan_sinks = torch.tensor([[0.5, float("nan")]], device="cuda")
    inf_sinks = torch.tensor([[float("inf"), float("-inf")]], device="cuda")
    x, w, b = (t.cuda() for t in _route_inputs())
    nan_bias, inf_bias = b.clone(), b.clone()
    nan_bias[2] = float("nan")
    inf_bias[2], inf_bias[5] = float("inf"), float("-inf")
    m2.attention(q, k, v, cu, cu, sinks=nan_sinks, max_seqlen_q=6, max_seqlen_k=6)  # no sync, no check
    m2.moe_route(x, w, nan_bias, top_k=2)
    previous = m2.set_device_value_checks(True)
    try:
        with pytest.raises(m2.InvalidValueError, match="'sinks' must be values without NaN"):
            m2.attention(q, k, v, cu, cu, sinks=nan_sinks, max_seqlen_q=6, max_seqlen_k=6)
        with pytest.raises(m2.InvalidValueError, match="'bias' must be values without NaN"):
            m2.moe_route(x, w, nan_bias, top_k=2)
        o = m2.attention(q, k, v, cu, cu, sinks=inf_sinks, max_seqlen_q=6, max_seqlen_k=6)  # ±inf pass
        assert bool((o[:, 0] == 0).all())
        _, idx = m2.moe_route(x, w, inf_bias, top_k=2)
        assert bool((idx[0, :, 0] == 2).all()) and not bool((idx[1] == 1).any())
    finally:
        m2.set_device_value_checks(previous)


def test_a_qk_norm_rope_source_outside_the_tokens_raises_on_the_reference() -> None:
    """The host does not check ``index`` (that would sync on a GPU); the torch providers' ``index_select``
    refuses a row outside ``[0, T)`` (the Triton kernel's NaN row is its own test)."""
    x, w = torch.randn(4, 2, 8), torch.zeros(1, 8)
    angles = torch.randn(4, 4)
    rope = torch.cat((angles.sin(), angles.cos()), dim=-1)
    with pytest.raises((IndexError, RuntimeError)):
        m2.qk_norm_rope(x, w, rope, index=torch.tensor([0, 1, 4, 2]), provider="reference")
    index = torch.tensor([3, 1, 0, 2])  # in range: row t is x's row index[t], rotated by rope[t]
    y = m2.qk_norm_rope(x, w, rope, index=index, provider="reference")
    assert torch.equal(y, m2.qk_norm_rope(x[index], w, rope, provider="reference"))


def test_qk_norm_rope_refuses_angles_that_require_grad() -> None:
    """Forward-only, as every op: a ``rope`` that requires grad raises, naming it, instead of a result
    without a graph."""
    x, w = torch.randn(4, 2, 8), torch.zeros(1, 8)
    rope = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(m2.InvalidValueError, match="'rope'"):
        m2.qk_norm_rope(x, w, rope, provider="reference")
    with torch.no_grad():
        assert m2.qk_norm_rope(x, w, rope, provider="reference").shape == (4, 2, 8)


def test_an_output_gate_source_outside_the_tokens_raises_on_the_reference() -> None:
    """As for ``qk_norm_rope``: ``index`` is not checked on the host; ``index_select`` refuses it."""
    x, gate = torch.randn(4, 2, 8), torch.randn(4, 2, 1)
    with pytest.raises((IndexError, RuntimeError)):
        m2.output_gate(x, gate, index=torch.tensor([0, 1, 4, 2]), provider="reference")
    index = torch.tensor([3, 1, 0, 2])  # in range: row t is x's row index[t], gated by gate[t]
    y = m2.output_gate(x, gate, index=index, provider="reference")
    assert torch.equal(y, m2.output_gate(x[index], gate, provider="reference"))


def test_output_gate_refuses_a_gate_that_requires_grad() -> None:
    x, gate = torch.randn(4, 2, 8), torch.randn(4, 2, requires_grad=True)
    with pytest.raises(m2.InvalidValueError, match="'gate'"):
        m2.output_gate(x, gate, provider="reference")
    with torch.no_grad():
        assert m2.output_gate(x, gate, provider="reference").shape == (4, 2, 8)


def test_the_output_gate_rule_passes_both_upstream_forms_and_fails_a_wrong_gather() -> None:
    """The contract's rule passes the FP32 product rounded once (inductor's form, torch_native's) and
    vllm-omni's eager form, which rounds ``sigmoid(gate)`` to BF16 before the product (within one ULP of
    the result), and fails a form that skips the gather or gates by the source row: the rule can fail."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(512, 4, 64, generator=g).bfloat16()
    gate = (3 * torch.randn(512, 4, 1, generator=g)).bfloat16()
    index = torch.randperm(512, generator=g)
    ref = m2.output_gate(x, gate, index=index, provider="reference")
    assert acc.accept_output_gate((x[index].float() * torch.sigmoid(gate.float())).bfloat16(), ref, gate)
    assert acc.accept_output_gate(x[index] * torch.sigmoid(gate), ref, gate)  # BF16 sigmoid, BF16 product
    assert not acc.accept_output_gate((x.float() * torch.sigmoid(gate.float())).bfloat16(), ref, gate)
    assert not acc.accept_output_gate((x[index].float() * torch.sigmoid(gate[index].float())).bfloat16(), ref, gate)
