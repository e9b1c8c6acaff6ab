"""Prepared MoE weights, raw weights read as they are now, compile/deterministic/FP16/FP32 serving.

CPU: the Triton kernels run under TRITON_INTERPRET=1 on small shapes (the provider is registered
for the CPU there). GPU (`gpu` marker): real widths, CUDA graphs, torch.compile with Inductor.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from magi2_backend_reference.moe import exact_moe_experts
from magi2_backend_triton.moe.align import (
    RouteBuffers,
    align_routes_stable,
    route_capacity,
)
from magi2_backend_triton.moe.pack import interleaved_bank, pack_w13
from magi2_backend_triton.providers import TritonMoEExperts
from moe_align_oracle import align_routes

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_moe_experts
from magi2_core.nn import HeadRoutedMoE
from magi2_core.ops import dispatcher
from magi2_core.ops.moe_experts import ExpertsCall

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"
needs_cuda = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU")


def make_moe(
    tokens: int,
    heads: int,
    experts: int,
    d: int,
    inter: int,
    topk: int,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str = DEVICE,
    seed: int = 0,
) -> tuple[torch.Tensor, ...]:
    """Fresh random inputs; distinct per-head expert ids per token; routing weights ~ route_scale."""
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    x = randn(tokens, heads, d)
    w_gate = randn(heads * experts, d, inter, scale=2 / math.sqrt(d))
    w_up = randn(heads * experts, d, inter, scale=2 / math.sqrt(d))
    w_down = randn(heads * experts, inter, d, scale=1 / math.sqrt(inter))
    idx = torch.rand(heads, tokens, experts, generator=g, device=device).argsort(dim=-1)[..., :topk]
    probs = torch.softmax(torch.randn(heads, tokens, topk, generator=g, device=device), dim=-1) * 4.9
    return x, probs, idx, w_gate, w_up, w_down


def assert_within_one_ulp(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    up = torch.nextafter(ref, torch.full_like(ref, float("inf"))).double()
    down = torch.nextafter(ref, torch.full_like(ref, float("-inf"))).double()
    ulp = torch.maximum(up - ref.double(), ref.double() - down)
    err = (out.double() - ref.double()).abs()
    assert not (err > ulp).any(), f"{int((err > ulp).sum())} elements over 1 ULP, max err {float(err.max())}"


# ---- preparation -------------------------------------------------------------------------------


def test_triton_prepares_one_bank_and_exposes_checkpoint_views(pack_count: Callable[[], int]) -> None:
    _, _, _, wg, wu, wd = make_moe(5, 2, 4, 32, 48, 2)
    before = pack_count()
    prepared = m2.prepare_moe_weights(wg, wu, wd)
    assert pack_count() == before + 1
    assert (prepared.provider, prepared.layout) == ("triton", "w13_interleaved")
    w13, down = prepared.tensors
    assert w13.shape == (8, 96, 32) and w13.is_contiguous() and torch.equal(w13, pack_w13(wg, wu))
    assert torch.equal(prepared.w_gate, wg) and torch.equal(prepared.w_up, wu) and prepared.w_down is down
    for view in (prepared.w_gate, prepared.w_up):  # views of the bank, not copies
        assert view.untyped_storage().data_ptr() == w13.untyped_storage().data_ptr()
    # Bytes per layer: the bank + w_down once prepared, as many as the raw weights.
    raw = wg.nbytes + wu.nbytes + wd.nbytes
    assert prepared.nbytes == raw == w13.nbytes + wd.nbytes
    assert interleaved_bank(prepared.w_gate, prepared.w_up) is not None
    assert "w13_interleaved" in repr(prepared)


def test_reference_preparation_is_the_identity() -> None:
    _, _, _, wg, wu, wd = make_moe(5, 2, 4, 32, 48, 2)
    prepared = m2.prepare_moe_weights(wg, wu, wd, provider="reference")
    assert (prepared.provider, prepared.layout) == ("reference", "checkpoint")
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(prepared.tensors, (wg, wu, wd), strict=True))


def test_prepared_and_raw_give_the_same_bits_through_the_op() -> None:
    x, probs, idx, wg, wu, wd = make_moe(9, 3, 4, 32, 32, 2, seed=3)
    prepared = m2.prepare_moe_weights(wg, wu, wd)
    y = m2.moe_experts(x, probs, idx, prepared)
    assert torch.equal(y, m2.moe_experts(x, probs, idx, wg, wu, wd))
    assert_within_one_ulp(y, exact_moe_experts(x, probs, idx, wg, wu, wd))
    assert m2.resolve("moe_experts", x, probs, idx, prepared).chosen == "triton"


def test_weights_prepared_by_one_provider_are_served_correctly_by_another() -> None:
    x, probs, idx, wg, wu, wd = make_moe(7, 2, 4, 32, 32, 3, seed=4)
    expected = exact_moe_experts(x, probs, idx, wg, wu, wd)
    packed = m2.prepare_moe_weights(wg, wu, wd, provider="triton")
    assert_within_one_ulp(m2.moe_experts(x, probs, idx, packed, provider="reference"), expected)
    plain = m2.prepare_moe_weights(wg, wu, wd, provider="reference")
    assert_within_one_ulp(m2.moe_experts(x, probs, idx, plain, provider="triton"), expected)


def test_prepared_weights_reject_extra_tensors_and_bad_layouts() -> None:
    x, probs, idx, wg, wu, wd = make_moe(3, 1, 4, 16, 32, 2)
    prepared = m2.prepare_moe_weights(wg, wu, wd)
    with pytest.raises(m2.InvalidValueError, match="omitted when w_gate is a PreparedMoEWeights"):
        m2.moe_experts(x, probs, idx, prepared, wu, wd)
    with pytest.raises(m2.InvalidValueError, match="layout"):
        m2.PreparedMoEWeights.from_layout("triton", "w13_tiled", prepared.tensors)
    with pytest.raises(m2.InvalidShapeError, match="w_down"):
        m2.prepare_moe_weights(wg, wu, wd.transpose(1, 2))


# ---- no re-packs across layers; raw weights never cached -----------------------------------------


def test_layers_called_in_turn_never_pack(pack_count: Callable[[], int]) -> None:
    layers = [make_moe(5, 2, 4, 32, 32, 2, seed=10 + n) for n in range(3)]
    x, probs, idx = layers[0][:3]
    prepared = [m2.prepare_moe_weights(*w[3:]) for w in layers]
    start = pack_count()
    first: list[torch.Tensor] = []
    for _ in range(3):
        outs = [m2.moe_experts(x, probs, idx, p) for p in prepared]
        outs += [m2.moe_experts(x, probs, idx, *w[3:]) for w in layers]
        if not first:
            first, after_first = outs, pack_count()
        assert all(torch.equal(a, b) for a, b in zip(outs, first, strict=True))
    assert after_first == start  # prepared layers read their bank, raw ones are read in place
    assert pack_count() == after_first


def _data_copy(w: torch.nn.Parameter, new: torch.Tensor) -> None:
    w.data.copy_(new)  # how vLLM's weight loaders and RL refits write: autograd's version counter stays


def _data_assign(w: torch.nn.Parameter, new: torch.Tensor) -> None:
    w.data = new.clone()


def _numpy(w: torch.nn.Parameter, new: torch.Tensor) -> None:
    w.detach().view(torch.int16).numpy()[...] = new.view(torch.int16).numpy()  # BF16 bits, through numpy


def _copy(w: torch.nn.Parameter, new: torch.Tensor) -> None:
    with torch.no_grad():
        w.copy_(new)


def _optimizer_step(w: torch.nn.Parameter, new: torch.Tensor) -> None:
    w.grad = (w.detach() - new).float().to(w.dtype)
    torch.optim.SGD([w], lr=1.0).step()  # w - (w - new) = new, in place


WRITES: dict[str, Callable[[torch.nn.Parameter, torch.Tensor], None]] = {
    "data.copy_": _data_copy,
    "data =": _data_assign,
    "numpy": _numpy,
    "copy_": _copy,
    "optimizer": _optimizer_step,
}


@pytest.mark.skipif(not INTERPRET, reason="interpreter test")
@pytest.mark.parametrize("write", WRITES.values(), ids=list(WRITES))
@pytest.mark.parametrize("form", ["raw", "prepared"])
def test_weights_written_between_calls_are_what_the_next_call_computes_with(
    write: Callable[[torch.nn.Parameter, torch.Tensor], None], form: str
) -> None:
    x, probs, idx, wg, wu, wd = make_moe(9, 2, 4, 32, 32, 2, seed=21)
    *_, ng, nu, nd = make_moe(9, 2, 4, 32, 32, 2, seed=22)
    if form == "prepared":
        prepared = m2.prepare_moe_weights(wg, wu, wd, provider="triton")
        wg, wu, wd = prepared.w_gate, prepared.w_up, prepared.w_down
    params = [torch.nn.Parameter(w, requires_grad=False) for w in (wg, wu, wd)]

    def call() -> torch.Tensor:
        with torch.no_grad():
            return m2.moe_experts(x, probs, idx, *params, provider="triton")  # the same objects every call

    before = [p.detach().clone() for p in params]
    assert_within_one_ulp(call(), exact_moe_experts(x, probs, idx, *before))
    for p, new in zip(params, (ng, nu, nd), strict=True):
        if write is _optimizer_step:
            p.requires_grad_(True)
        write(p, new)
        p.requires_grad_(False)
    now = [p.detach().clone() for p in params]  # the new values (an optimizer step rounds on the way)
    assert not any(torch.equal(a, b) for a, b in zip(now, before, strict=True))
    assert_within_one_ulp(call(), exact_moe_experts(x, probs, idx, *now))


def test_interleaved_bank_is_recognised_only_for_views_of_one_bank() -> None:
    wg, wu = torch.randn(3, 8, 5), torch.randn(3, 8, 5)
    bank = pack_w13(wg, wu)
    view_g, view_u = bank[:, 0::2].transpose(1, 2), bank[:, 1::2].transpose(1, 2)
    found = interleaved_bank(view_g, view_u)
    assert found is not None and found.data_ptr() == bank.data_ptr() and torch.equal(found, bank)
    assert interleaved_bank(wg, wu) is None
    assert interleaved_bank(view_u, view_g) is None  # swapped: up is not at gate + d
    other = pack_w13(wg, wu)
    assert interleaved_bank(view_g, other[:, 1::2].transpose(1, 2)) is None  # two different banks


# ---- the module ----------------------------------------------------------------------------------


def test_module_prepares_at_construction_and_after_loading() -> None:
    torch.manual_seed(5)
    moe = HeadRoutedMoE(num_heads=2, head_dim=16, num_experts=4, intermediate=32, top_k=2)
    prepared = moe._prepared
    assert prepared is not None and prepared.layout == "w13_interleaved"
    assert moe.w_gate.untyped_storage().data_ptr() == prepared.tensors[0].untyped_storage().data_ptr()
    state = moe.state_dict()
    assert list(state) == ["router", "w_gate", "w_up", "w_down", "expert_bias"]
    assert state["w_gate"].shape == (8, 16, 32) and state["w_down"].shape == (8, 32, 16)
    assert all(t.is_contiguous() and t.dtype in (torch.float32, torch.bfloat16) for t in state.values())
    assert state["w_gate"].dtype == torch.bfloat16

    other = HeadRoutedMoE(num_heads=2, head_dim=16, num_experts=4, intermediate=32, top_k=2)
    x = torch.randn(6, 32).bfloat16()
    for assign in (False, True):
        other.load_state_dict({k: v.clone() for k, v in state.items()}, assign=assign)
        assert other._prepared is not None and other._prepared.layout == "w13_interleaved"
        assert interleaved_bank(other.w_gate, other.w_up) is not None
        with torch.no_grad():
            assert torch.equal(other(x), moe(x))
    with torch.no_grad():  # a parameter replaced by hand is still honoured (raw path)
        other.w_gate = torch.nn.Parameter(other.w_gate.detach().contiguous() * 2)
        heads = x.view(6, 2, 16)
        probs, idx = m2.moe_route(heads, other.router, other.get_buffer("expert_bias"), top_k=2)
        expected = m2.moe_experts(heads, probs, idx, other.w_gate, other.w_up, other.w_down)
        assert torch.equal(other(x), expected.reshape(6, 32))


def test_module_dtype_move_prepares_again() -> None:
    moe = HeadRoutedMoE(num_heads=1, head_dim=16, num_experts=4, intermediate=16, top_k=2).to(torch.float32)
    assert moe.w_gate.dtype == torch.float32
    assert moe._prepared is not None and moe._prepared.w_gate.dtype == torch.float32
    assert interleaved_bank(moe.w_gate, moe.w_up) is not None


# ---- compile, deterministic, FP16/FP32 -----------------------------------------------------------


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    calls: list[bool] = []
    original = TritonMoEExperts.__call__

    def counted(self: TritonMoEExperts, call: ExpertsCall) -> torch.Tensor:
        calls.append(call.deterministic)
        return original(self, call)

    monkeypatch.setattr(TritonMoEExperts, "__call__", counted)
    dispatcher().clear()
    return calls


def test_triton_serves_inside_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    torch._dynamo.reset()
    x, probs, idx, wg, wu, wd = make_moe(7, 2, 4, 32, 32, 2, seed=6)
    prepared = m2.prepare_moe_weights(wg, wu, wd)
    calls = _counting(monkeypatch)

    def two_layers(x: torch.Tensor) -> torch.Tensor:
        h = m2.moe_experts(x, probs, idx, prepared)
        return m2.moe_experts(h, probs, idx, wg, wu, wd)

    eager = two_layers(x)
    compiled = torch.compile(two_layers, fullgraph=True, backend="aot_eager")(x)
    assert torch.equal(compiled, eager)
    assert len(calls) == 4  # both layers, eager and compiled, ran the Triton kernel


def test_deterministic_mode_is_served_by_triton_and_repeats_bitwise(monkeypatch: pytest.MonkeyPatch) -> None:
    x, probs, idx, wg, wu, wd = make_moe(11, 2, 3, 32, 32, 3, seed=7)  # many routes per expert
    calls = _counting(monkeypatch)
    runs = [m2.moe_experts(x, probs, idx, wg, wu, wd, deterministic=True) for _ in range(2)]
    assert calls == [True, True]
    assert torch.equal(runs[0], runs[1])
    assert torch.equal(runs[0], m2.moe_experts(x, probs, idx, wg, wu, wd))  # same bits as the default path
    assert_within_one_ulp(runs[0], exact_moe_experts(x, probs, idx, wg, wu, wd))


@pytest.mark.parametrize("ids", [[], [2, 0, 2, 0, 2], [3] * 9 + [0, 3, 0]], ids=["empty", "alternating", "heavy"])
def test_stable_alignment_keeps_route_order_inside_each_expert(ids: list[int]) -> None:
    rid = torch.tensor(ids, dtype=torch.int32, device=DEVICE)
    capacity = route_capacity(rid.numel(), 5, 4)
    stable = align_routes_stable(rid, 5, RouteBuffers.allocate(capacity, 4, 5, torch.device(DEVICE)))
    plain = align_routes(rid, 5, RouteBuffers.allocate(capacity, 4, 5, torch.device(DEVICE)))
    used = int(plain.num_padded)
    assert int(stable.num_padded) == used
    assert torch.equal(stable.expert_ids[: used // 4], plain.expert_ids[: used // 4])
    expected = torch.full((capacity,), rid.numel(), dtype=torch.int32)
    slot = 0
    for e in range(5):  # each expert's routes in ascending order, then padding to the block
        routes = [r for r, v in enumerate(ids) if v == e]
        expected[slot : slot + len(routes)] = torch.tensor(routes, dtype=torch.int32)
        slot += -(-len(routes) // 4) * 4
    assert torch.equal(stable.sorted_ids.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_fp16_and_fp32_are_served_by_triton_at_the_contract(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    x, probs, idx, wg, wu, wd = make_moe(9, 2, 4, 32, 48, 3, dtype=dtype, seed=8)
    calls = _counting(monkeypatch)
    y = m2.moe_experts(x, probs, idx, m2.prepare_moe_weights(wg, wu, wd))
    assert calls == [False] and y.dtype == dtype
    ref = exact_moe_experts(x, probs, idx, wg, wu, wd)
    assert accept_moe_experts(y, ref, 48)
    oracle = exact_moe_experts(*(t.double() if t.is_floating_point() else t for t in (x, probs, idx, wg, wu, wd)))
    tight = 2e-3 if dtype == torch.float16 else 1e-6  # FP16 roundings vs none at all in FP32
    assert float((y.double() - oracle).norm() / oracle.norm()) < tight


# ---- GPU -----------------------------------------------------------------------------------------

PROD = (256, 256, 1280, 6)  # E, d, I, K of one production-local head


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("tokens", [512, 4096, 14601])
def test_gpu_prepared_and_raw_are_bit_equal(tokens: int) -> None:
    e, d, i, k = PROD
    x, probs, idx, wg, wu, wd = make_moe(tokens, 3, e, d, i, k, device="cuda")
    prepared = m2.prepare_moe_weights(wg, wu, wd)
    assert prepared.provider == "triton" and prepared.nbytes == wg.nbytes + wu.nbytes + wd.nbytes
    assert torch.equal(m2.moe_experts(x, probs, idx, prepared), m2.moe_experts(x, probs, idx, wg, wu, wd))


@pytest.mark.gpu
@needs_cuda
def test_gpu_compile_fullgraph_serves_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    torch._dynamo.reset()
    e, d, i, k = PROD
    x, probs, idx, wg, wu, wd = make_moe(4096, 3, e, d, i, k, device="cuda")
    prepared = m2.prepare_moe_weights(wg, wu, wd)
    calls = _counting(monkeypatch)

    def layer(x: torch.Tensor) -> torch.Tensor:
        return m2.moe_experts(x * 1.0, probs, idx, prepared)

    eager = layer(x)
    compiled = torch.compile(layer, fullgraph=True)(x)  # Inductor
    assert len(calls) == 2
    assert torch.equal(compiled, eager)


@pytest.mark.gpu
@needs_cuda
def test_gpu_cuda_graph_two_layer_stack_replays_bit_equal(pack_count: Callable[[], int]) -> None:
    torch.manual_seed(9)
    with torch.device("cuda"):  # built on the GPU: prepared there at construction
        stack = torch.nn.Sequential(
            *[HeadRoutedMoE(num_heads=3, head_dim=256, num_experts=256, intermediate=1280, top_k=6) for _ in range(2)]
        )
    for layer in stack:
        assert isinstance(layer, HeadRoutedMoE) and interleaved_bank(layer.w_gate, layer.w_up) is not None
    x = torch.randn(4096, 768, device="cuda").bfloat16()
    static_in = x.clone()
    with torch.no_grad():
        eager = stack(x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                stack(static_in)
        torch.cuda.current_stream().wait_stream(side)
        packs = pack_count()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # a host sync or a sync-needing op would fail the capture
            static_out = stack(static_in)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager)
        static_in.copy_(torch.randn_like(x))
        graph.replay()
        assert torch.equal(static_out, stack(static_in))
        stack(torch.randn(700, 768, device="cuda").bfloat16())  # eager call with other buffer sizes
        graph.replay()  # the graph owns its buffers: an eager reallocation cannot free them
        assert torch.equal(static_out, stack(static_in))
    assert pack_count() == packs


@pytest.mark.gpu
@needs_cuda
def test_gpu_cuda_graph_with_raw_weights_reads_them_in_place() -> None:
    e, d, i, k = PROD
    x, probs, idx, wg, wu, wd = make_moe(4096, 3, e, d, i, k, device="cuda")
    eager = m2.moe_experts(x, probs, idx, wg, wu, wd)  # warm-up (raw weights: read in place, never packed)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = m2.moe_experts(x, probs, idx, wg, wu, wd)
    torch.cuda.empty_cache()
    graph.replay()
    torch.cuda.synchronize()
    result = accept_moe_experts(out, eager, i)
    assert result, str(result)
    wg.mul_(0.5)  # an in-place update is seen by the next replay (read in place)
    graph.replay()
    assert out.isfinite().all()
    result = accept_moe_experts(out, m2.moe_experts(x, probs, idx, wg, wu, wd), i)
    assert result, str(result)


@pytest.mark.gpu
@needs_cuda
def test_gpu_deterministic_mode_repeats_bitwise() -> None:
    e, d, i, k = PROD
    x, probs, idx, wg, wu, wd = make_moe(4096, 3, e, d, i, k, device="cuda")
    prepared = m2.prepare_moe_weights(wg, wu, wd)
    runs = [m2.moe_experts(x, probs, idx, prepared, deterministic=True) for _ in range(3)]
    assert all(torch.equal(runs[0], r) for r in runs[1:])
    ref = exact_moe_experts(x, probs, idx, wg, wu, wd)
    assert accept_moe_experts(runs[0], ref, i)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("tokens", [1, 513, 4096])
def test_gpu_fp16_fp32_meet_the_contract(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, tokens: int) -> None:
    e, d, i, k = PROD
    x, probs, idx, wg, wu, wd = make_moe(tokens, 3, e, d, i, k, dtype=dtype, device="cuda")
    calls = _counting(monkeypatch)
    y = m2.moe_experts(x, probs, idx, m2.prepare_moe_weights(wg, wu, wd))
    assert calls == [False]
    result = accept_moe_experts(y, exact_moe_experts(x, probs, idx, wg, wu, wd), i)
    assert result, str(result)
