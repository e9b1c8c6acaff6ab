"""Fused head-routed BF16 MoE (operators.md §3.4-3.5) against the reference rounding schedule.

CPU: the kernels run under TRITON_INTERPRET=1 on small shapes. There the kernels round FP32 ->
BF16 to nearest-even by hand (the interpreter's cast truncates) and upcast dot operands to FP32
(bf16 products are exact in FP32), so every stored BF16 value equals the reference's up to the
FP32 accumulation order: outputs are compared with a bound of 1 BF16 ULP per element.
GPU (`gpu` marker): real widths, rel-L2 < 1e-3 against the FP32-reduced reference, finite.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from magi2_backend_reference.moe import exact_moe_experts
from magi2_backend_triton.moe import MoEState, fused_moe_experts
from magi2_backend_triton.moe.align import (
    ExpertLists,
    RouteBuffers,
    align_routes_device,
    align_routes_device_stable,
    align_routes_stable,
    expert_lists_device,
    flat_route_experts,
    route_capacity,
)
from magi2_backend_triton.moe.fused import run_fused
from magi2_backend_triton.moe.pack import pack_w13
from magi2_backend_triton.moe.tiles import SliceTile
from moe_align_oracle import align_routes

import magi2_core as m2
from magi2_core.errors import InvalidValueError
from magi2_core.model.plan import Plan

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# Small-shape tests run under the interpreter on CPU, and natively when a GPU is present.
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"
needs_cuda = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="needs a CUDA GPU")


def one_kernel_plan(variant: str, tile: SliceTile, align: str = "atomic", **flags: int) -> Plan:
    """A plan for a one-kernel variant (tiles.py's vocabulary), as a test names it."""
    sizes = {
        "BLOCK_M": tile.block_m,
        "BLOCK_I": tile.block_i,
        "num_warps": tile.num_warps,
        "num_stages": tile.num_stages,
    }
    return Plan(variant=variant, tile=sizes | flags, align=align, why="test")


def two_kernel_plan(bm: int = 16, n: int = 16, k: int = 16, align: str = "atomic", **flags: int) -> Plan:
    gemm = {"BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, "num_warps": 4, "num_stages": 1}
    sizes = {"BLOCK_M": bm} | {f"{key}{g}": v for g in (1, 2) for key, v in gemm.items()}
    return Plan(variant="two_kernel", tile=sizes | flags, align=align, why="test")


_T16 = SliceTile(16, 16, 4, 1)
TWO_KERNEL = two_kernel_plan()
VARIANTS = {
    "two_kernel_packed": TWO_KERNEL,
    "two_kernel_direct": two_kernel_plan(PACKED_W13=0),
    "single_packed": one_kernel_plan("one_kernel", _T16, INTERLEAVED=0),
    "single_direct": one_kernel_plan("one_kernel", _T16, PACKED_W13=0, INTERLEAVED=0),
    "single_interleaved": one_kernel_plan("one_kernel", _T16),
}


def make_moe(
    tokens: int, heads: int, experts: int, d: int, inter: int, topk: int, device: str = DEVICE
) -> tuple[torch.Tensor, ...]:
    """Fresh random inputs; unique per-head expert ids per token; routing weights ~ route_scale."""
    x = torch.randn(tokens, heads, d, device=device).bfloat16()
    w_gate = (torch.randn(heads * experts, d, inter, device=device) / math.sqrt(d) * 2).bfloat16()
    w_up = (torch.randn(heads * experts, d, inter, device=device) / math.sqrt(d) * 2).bfloat16()
    w_down = (torch.randn(heads * experts, inter, d, device=device) / math.sqrt(inter)).bfloat16()
    idx = torch.rand(heads, tokens, experts, device=device).argsort(dim=-1)[..., :topk]
    probs = torch.softmax(torch.randn(heads, tokens, topk, device=device), dim=-1) * 4.9
    return x, probs, idx, w_gate, w_up, w_down


def assert_within_one_ulp(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype == torch.bfloat16 and out.shape == ref.shape
    up = torch.nextafter(ref, torch.full_like(ref, float("inf"))).double()
    down = torch.nextafter(ref, torch.full_like(ref, float("-inf"))).double()
    ulp = torch.maximum(up - ref.double(), ref.double() - down)
    err = (out.double() - ref.double()).abs()
    bad = err > ulp
    assert not bad.any(), f"{int(bad.sum())} elements over 1 BF16 ULP, max err {float(err.max())}"


# ---- route alignment ---------------------------------------------------------------------------


@pytest.mark.parametrize("ids", [[], [2, 0, 2, 0, 2], [3] * 9 + [0, 3, 0]], ids=["empty", "alternating", "heavy"])
def test_align_routes_preserves_routes_and_pads_expert_blocks(ids: list[int]) -> None:
    # One head, E=5, K=1, BM=4 (upstream's cases).
    check_alignment(torch.tensor(ids, dtype=torch.int64, device=DEVICE).view(1, -1, 1), 5, 4)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_align_routes_random_production_like(seed: int) -> None:
    torch.manual_seed(seed)
    idx = torch.rand(3, 301, 256, device=DEVICE).argsort(dim=-1)[..., :6]  # 3 heads x 256 experts, odd T
    check_alignment(idx, 256, 16)


def check_alignment(idx: torch.Tensor, experts_per_head: int, bm: int) -> None:
    """Every implementation (the atomic and the stable device kernels, the torch statement) against
    the contract. The interpreter sorts slowly (about 0.25 s per chunk of 64 routes): there the
    stable kernels take chunks of 64 and only small cases (the production-like shape runs once, in
    `test_stable_device_alignment_equals_the_torch_statement`)."""
    rid = flat_route_experts(idx, experts_per_head)
    num_experts = idx.shape[0] * experts_per_head
    interpreted = INTERPRET or not idx.is_cuda
    chunk = 64 if interpreted else None
    stable = () if interpreted and rid.numel() > 1024 else ("device_stable",)
    for align in ("device", *stable, "torch"):
        capacity = route_capacity(rid.numel(), num_experts, bm)
        bufs = RouteBuffers.allocate(capacity, bm, num_experts, rid.device, chunk=chunk)
        bufs.sorted_ids.fill_(-7)  # poison: every slot below the padded count must be rewritten
        bufs.expert_ids.fill_(-7)
        if align == "device":
            align_routes_device(idx, experts_per_head, bufs)
        elif align == "device_stable":
            align_routes_device_stable(idx, experts_per_head, bufs)
        else:
            align_routes(rid, num_experts, bufs)
        check_aligned(rid, num_experts, bm, bufs)


@pytest.mark.parametrize(
    ("heads", "tokens", "experts", "topk", "bm", "chunk"),
    [
        (1, 0, 5, 1, 4, 16),
        (1, 9, 5, 1, 4, 4),
        (2, 37, 8, 3, 16, 16),
        (3, 301, 256, 6, 16, 64),
        (2, 50, 4, 2, 128, 32),
        (1, 64, 3, 1, 4, 64),
    ],
)
def test_stable_device_alignment_equals_the_torch_statement(
    heads: int, tokens: int, experts: int, topk: int, bm: int, chunk: int
) -> None:
    # Bit for bit: each expert's routes in route order, across chunks (more experts than a chunk
    # holds, a partial last chunk, one full chunk, no routes at all).
    torch.manual_seed(tokens + chunk)
    idx = torch.rand(heads, tokens, experts, device=DEVICE).argsort(dim=-1)[..., :topk]
    rid = flat_route_experts(idx, experts)
    num_experts = heads * experts
    capacity = route_capacity(rid.numel(), num_experts, bm)
    got = RouteBuffers.allocate(capacity, bm, num_experts, rid.device, chunk=chunk)
    want = RouteBuffers.allocate(capacity, bm, num_experts, rid.device)
    got.sorted_ids.fill_(-7)
    align_routes_device_stable(idx, experts, got)
    align_routes_stable(rid, num_experts, want)
    padded = int(want.num_padded.item())
    assert int(got.num_padded.item()) == padded
    assert torch.equal(got.sorted_ids[:padded], want.sorted_ids[:padded])
    assert torch.equal(got.expert_ids[: padded // bm], want.expert_ids[: padded // bm])
    assert torch.equal(got.counts, torch.bincount(rid.long(), minlength=num_experts).int())


@pytest.mark.parametrize(
    ("device", "interpreting", "experts", "deterministic", "expected"),
    [
        ("cuda", False, 768, False, "stable_kernels"),
        ("cuda", False, 3072, False, "atomic"),
        ("cuda", False, 3072, True, "stable_kernels"),
        ("musa", False, 768, False, "atomic"),
        ("musa", False, 768, True, "stable_torch"),
        ("cpu", True, 768, False, "atomic"),
        ("cpu", True, 768, True, "stable_torch"),
    ],
)
def test_alignment_choice(
    monkeypatch: pytest.MonkeyPatch, device: str, interpreting: bool, experts: int, deterministic: bool, expected: str
) -> None:
    from magi2_backend_triton.moe import plan

    monkeypatch.setattr(plan, "interpreting", lambda: interpreting)
    assert plan.choose_alignment(plan.DeviceId(device, None, None), experts, deterministic) == expected


def test_route_buffers_take_power_of_two_chunks() -> None:
    with pytest.raises(ValueError, match="power of two"):
        RouteBuffers.allocate(64, 4, 5, torch.device("cpu"), chunk=48)


def check_aligned(rid: torch.Tensor, num_experts: int, bm: int, bufs: RouteBuffers) -> None:
    num_routes = rid.numel()
    assert bufs.sorted_ids.dtype == bufs.expert_ids.dtype == bufs.num_padded.dtype == torch.int32
    counts = torch.bincount(rid.long().cpu(), minlength=num_experts)
    padded = int(((counts + bm - 1) // bm * bm).sum())
    assert int(bufs.num_padded.item()) == padded
    live = bufs.sorted_ids.cpu()[:padded]
    assert (live >= 0).all() and (live <= num_routes).all()
    routes = live[live < num_routes]
    assert torch.equal(routes.sort().values, torch.arange(num_routes, dtype=torch.int32))  # each once
    assert int((live == num_routes).sum()) == padded - num_routes
    experts = bufs.expert_ids.cpu()
    for b in range(padded // bm):
        block = live[b * bm : (b + 1) * bm]
        e = int(experts[b])
        assert 0 <= e < num_experts
        real = block[block < num_routes].long()
        assert real.numel() > 0  # padding never fills a whole block
        assert (rid.cpu()[real] == e).all()  # block/expert consistency
    assert (experts[: padded // bm].diff() >= 0).all()  # experts in order, one run each


@pytest.mark.parametrize(
    ("heads", "tokens", "experts", "topk"), [(1, 12, 5, 1), (3, 301, 256, 6), (2, 40, 4, 3)], ids=["k1", "prod", "dup"]
)
def test_expert_lists_hold_each_route_once_under_its_expert(heads: int, tokens: int, experts: int, topk: int) -> None:
    # The per-expert kernel's input: lists[f, :counts[f]] is exactly the set of routes of flat expert
    # f. "dup" repeats ids inside a token's top-k, so one expert can hold more than T routes of a head.
    torch.manual_seed(heads * tokens)
    idx = torch.randint(0, experts, (heads, tokens, topk), device=DEVICE)
    rid = flat_route_experts(idx, experts).long().cpu()
    lists = ExpertLists.allocate(heads * experts, tokens * topk, torch.device(DEVICE))
    lists.lists.fill_(-7)
    lists.counts.fill_(99)  # the builder must reset the counts itself
    expert_lists_device(idx, experts, lists)
    counts, table = lists.counts.cpu(), lists.lists.cpu().view(heads * experts, tokens * topk)
    assert torch.equal(counts.long(), torch.bincount(rid, minlength=heads * experts))
    for f in range(heads * experts):
        got = table[f, : int(counts[f])].long().sort().values
        assert torch.equal(got, (rid == f).nonzero().flatten())
    with pytest.raises(ValueError, match="routes per head"):
        expert_lists_device(idx[:, :-1], experts, lists)


def test_route_buffers_are_reused_and_reallocated() -> None:
    state = MoEState()
    first = state.route_buffers(8, 2, 4, torch.device("cpu"))
    assert state.route_buffers(8, 2, 4, torch.device("cpu")) is first
    assert state.route_buffers(7, 2, 4, torch.device("cpu")) is first  # same capacity
    bigger = state.route_buffers(257, 2, 4, torch.device("cpu"))
    assert bigger is not first and bigger.capacity >= 257 + 2 * 3
    assert state.route_allocations == 2


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "stable"])
@pytest.mark.parametrize("first", ["inference_mode", "no_grad"])
def test_cached_state_serves_inference_mode_and_no_grad_in_either_order(first: str, deterministic: bool) -> None:
    """State that one call caches (route buffers, packed banks) must be updatable by the next call in
    the other mode: an inference tensor cannot be written outside inference mode."""
    x, probs, idx, wg, wu, wd = make_moe(11, 2, 4, 16, 32, 2)
    state = MoEState()
    modes = {"inference_mode": torch.inference_mode, "no_grad": torch.no_grad}
    order = [first, next(m for m in modes if m != first)]
    outs = []
    for mode in order * 2:
        with modes[mode]():
            outs.append(fused_moe_experts(x, probs, idx, wg, wu, wd, state=state, deterministic=deterministic))
    assert state.route_allocations == 1
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    with torch.inference_mode():
        lists = state.expert_lists(8, 4, torch.device(DEVICE))
    lists.counts.zero_()  # the one-program-per-expert kernel's lists: cached the same way


def test_public_op_and_prepared_weights_in_either_mode() -> None:
    x, probs, idx, wg, wu, wd = make_moe(13, 2, 4, 16, 32, 2)
    with torch.inference_mode():
        prepared = m2.prepare_moe_weights(wg, wu, wd, provider="triton")
        a = m2.moe_experts(x, probs, idx, prepared, provider="triton")
    with torch.no_grad():
        b = m2.moe_experts(x, probs, idx, prepared, provider="triton")
        c = m2.moe_experts(x, probs, idx, wg, wu, wd, provider="triton")
    with torch.inference_mode():
        d = m2.moe_experts(x, probs, idx, wg, wu, wd, provider="triton")
    assert torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d)


# ---- packing and its cache -----------------------------------------------------------------------


def test_pack_w13_interleaves_gate_and_up_per_output_channel() -> None:
    wg = torch.randn(4, 8, 6).bfloat16()
    wu = torch.randn(4, 8, 6).bfloat16()
    packed = pack_w13(wg, wu)
    assert packed.shape == (4, 12, 8) and packed.is_contiguous()
    assert torch.equal(packed[:, 0::2, :], wg.transpose(1, 2))
    assert torch.equal(packed[:, 1::2, :], wu.transpose(1, 2))


def test_raw_weights_are_read_in_place_by_the_plans_raw_step(pack_count: Callable[[], int]) -> None:
    x, probs, idx, wg, wu, wd = make_moe(5, 2, 4, 32, 32, 2)
    packs = pack_count()
    run = run_fused(x, probs, idx, wg, wu, wd, state=MoEState())
    assert run.plan is not None and run.plan.tile.get("PACKED_W13") == 0 and "raw gate/up" in run.plan.why
    bank = pack_w13(wg, wu)
    prepared = run_fused(x, probs, idx, bank[:, 0::2].transpose(1, 2), bank[:, 1::2].transpose(1, 2), wd)
    assert prepared.plan is not None and prepared.plan.tile.get("PACKED_W13", 1) == 1
    assert torch.equal(run.y, prepared.y)  # the raw step is bit-identical
    assert pack_count() == packs  # neither call packed: the raw one read gate/up in place
    wg.data.mul_(0.5)  # bypasses the version counter: still what the next call reads
    assert_within_one_ulp(run_fused(x, probs, idx, wg, wu, wd).y, exact_moe_experts(x, probs, idx, wg, wu, wd))


def test_an_explicit_plan_that_reads_a_bank_packs_raw_weights_for_that_call_only(
    pack_count: Callable[[], int],
) -> None:
    x, probs, idx, wg, wu, wd = make_moe(5, 2, 4, 32, 32, 2)
    tiles = VARIANTS["single_packed"]
    packs = pack_count()
    run = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=tiles)
    assert run.plan == tiles and pack_count() == packs + 1  # run as given, with its own bank
    wg.data.add_(0.25)  # bypasses the version counter: the next call packs the new values
    y = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=tiles).y
    assert pack_count() == packs + 2
    assert_within_one_ulp(y, exact_moe_experts(x, probs, idx, wg, wu, wd))


# ---- forward against the reference schedule ---------------------------------------------------


CASES = {
    "odd_T": (7, 3, 5, 32, 48, 3),
    "T1": (1, 2, 4, 32, 32, 2),
    "one_head": (5, 1, 4, 16, 32, 4),
    "many_blocks": (25, 2, 3, 32, 32, 2),  # > BM routes per expert
}


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("case", list(CASES))
def test_fused_matches_reference_schedule(case: str, variant: str) -> None:
    x, probs, idx, wg, wu, wd = make_moe(*CASES[case])
    y = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=VARIANTS[variant]).y
    assert_within_one_ulp(y, exact_moe_experts(x, probs, idx, wg, wu, wd))


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_default_entry_point_several_seeds_int32_ids(seed: int) -> None:
    torch.manual_seed(seed)
    x, probs, idx, wg, wu, wd = make_moe(9, 3, 4, 32, 32, 2)
    y = fused_moe_experts(x, probs, idx.int(), wg, wu, wd)
    assert_within_one_ulp(y, exact_moe_experts(x, probs, idx, wg, wu, wd))


def test_empty_expert_and_silent_head() -> None:
    # Every token of head 0 routes to experts {0, 1}: experts 2..4 of head 0 get no routes.
    # Head 1 has all routing weights zero: its output must be exactly zero.
    x, probs, idx, wg, wu, wd = make_moe(6, 2, 5, 32, 32, 2)
    idx[0] = torch.tensor([0, 1], device=DEVICE)
    probs[1] = 0.0
    for tiles in (VARIANTS["two_kernel_packed"], VARIANTS["single_direct"]):
        y = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=tiles).y
        assert_within_one_ulp(y, exact_moe_experts(x, probs, idx, wg, wu, wd))
        assert (y[:, 1] == 0).all() and (y[:, 0] != 0).any()


def test_the_plan_takes_the_two_kernel_path_where_the_one_kernel_path_cannot() -> None:
    # I=48 is not a multiple of the 32-wide slice of the CPU's one-kernel row: its plan is the next row,
    # the two-kernel path, whose row block (16) the alignment follows. Asked for anyway, the one-kernel
    # path refuses the shape (no silent fallback).
    x, probs, idx, wg, wu, wd = make_moe(9, 2, 3, 32, 48, 2)
    run = run_fused(x, probs, idx, wg, wu, wd, state=MoEState())
    assert run.plan is not None and run.plan.variant == "two_kernel" and "row 1 (one_kernel)" in run.plan.why
    assert run.inter is not None and run.buffers is not None and run.buffers.block_m == 16
    assert_within_one_ulp(run.y, exact_moe_experts(x, probs, idx, wg, wu, wd))
    with pytest.raises(InvalidValueError, match="two_kernel here"):
        run_fused(
            x, probs, idx, wg, wu, wd, state=MoEState(), plan=one_kernel_plan("one_kernel", SliceTile(32, 32, 4, 1))
        )


def test_zero_tokens() -> None:
    x, probs, idx, wg, wu, wd = make_moe(0, 3, 4, 32, 32, 2)
    y = fused_moe_experts(x, probs, idx, wg, wu, wd)
    assert y.shape == (0, 3, 32) and y.dtype == torch.bfloat16


def test_stage_outputs_follow_the_rounding_schedule() -> None:
    # GEMM1 stores bf16(SwiGLU7(fp32 g, fp32 u)); GEMM2 stores bf16(fp32 down-proj * weight) per route.
    from magi2_core.contracts.moe import swiglu7

    x, probs, idx, wg, wu, wd = make_moe(7, 2, 3, 32, 48, 2)
    run = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=TWO_KERNEL)
    assert run.inter is not None and run.routed is not None and run.buffers is not None
    num_routes = idx.numel()
    slots = run.buffers.sorted_ids[: int(run.buffers.num_padded)]
    live = slots < num_routes
    routes = slots[live].long()
    rid = flat_route_experts(idx, 3).long()
    rows = routes // 2  # h*T + t
    a = x[rows % 7, rows // 7].float()
    g = torch.einsum("rd,rdi->ri", a, wg[rid[routes]].float())
    u = torch.einsum("rd,rdi->ri", a, wu[rid[routes]].float())
    mid = swiglu7(g, u).bfloat16()
    assert_within_one_ulp(run.inter[: slots.numel()][live], mid)
    out = torch.einsum("ri,rid->rd", mid.float(), wd[rid[routes]].float()) * probs.reshape(-1)[routes, None]
    assert_within_one_ulp(run.routed[routes], out.bfloat16())


def test_native_baseline_meets_the_contract_on_cpu() -> None:
    # The benchmarks' baseline. On CPU it is the exact per-expert loop (on sm90 it is _grouped_mm).
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from benchmarks._moe_native import grouped_mm_moe_experts

    x, probs, idx, wg, wu, wd = make_moe(7, 3, 4, 32, 48, 3, device="cpu")
    y = grouped_mm_moe_experts(x, probs, idx, wg, wu, wd)
    assert_within_one_ulp(y, exact_moe_experts(x, probs, idx, wg, wu, wd))


# ---- GPU ---------------------------------------------------------------------------------------


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(
    "shape",
    [
        (1, 1, 64, 80, 2, 4),
        (17, 3, 64, 80, 2, 4),
        (137, 2, 64, 80, 2, 4),
        (2, 3, 256, 1280, 6, 8),
        (129, 1, 256, 1280, 6, 8),
        (1, 3, 256, 1280, 6, 256),
        (513, 3, 256, 1280, 6, 256),
        (4097, 3, 256, 1280, 6, 256),
    ],
)
@pytest.mark.parametrize("variant", ["table", "two_kernel", "single"])
def test_gpu_real_kernel_parity(shape: tuple[int, ...], variant: str) -> None:
    from magi2_backend_triton.moe.fused import call_problem, run_plan
    from magi2_backend_triton.providers import triton_moe_experts

    tokens, heads, d, inter, topk, experts = shape
    x, probs, idx, wg, wu, wd = make_moe(tokens, heads, experts, d, inter, topk, device="cuda")
    # the plan, and the first two-kernel / Triton one-kernel (one_kernel, tma) alternative of the device's rows
    kinds = {"table": (), "two_kernel": ("two_kernel",), "single": ("one_kernel", "tma")}[variant]
    candidates = triton_moe_experts.plan_candidates(call_problem(x, idx, wg, False))
    plan = next((c for c in candidates if not kinds or c.variant in kinds), None)
    if plan is None and variant == "single":
        # no row of this device offers a one-kernel plan here: the `one_kernel` variant with the first plan's rows
        # per block, a 4-warp slice and the widest BLOCK_I (32 or 16) that divides the intermediate size
        first = candidates[0]
        block_i = 32 if inter % 32 == 0 else 16
        tile = {"BLOCK_M": first.tile["BLOCK_M"], "BLOCK_I": block_i, "num_warps": 4, "num_stages": 3}
        plan = first.model_copy(
            update={
                "variant": "one_kernel",
                "tile": tile,
                "align": (first.align if first.align != "lists" else "atomic"),
                "why": "test: the one_kernel plan",
            }
        )
    assert plan is not None, f"no {variant} plan for {shape}"
    y = run_plan(x, probs, idx, wg, wu, wd, plan, state=MoEState())
    ref = exact_moe_experts(x, probs, idx, wg, wu, wd)
    assert torch.isfinite(y).all()
    assert rel_l2(y, ref) < 1e-3
    tol = (2e-2, 0.5) if inter == 1280 else (2e-2, 4e-2)
    torch.testing.assert_close(y, ref, rtol=tol[0], atol=tol[1])


@pytest.mark.gpu
@needs_cuda
def test_gpu_forward_never_syncs_and_route_alignment_matches_host() -> None:
    x, probs, idx, wg, wu, wd = make_moe(14601, 3, 256, 256, 1280, 6, device="cuda")
    state = MoEState()
    fused_moe_experts(x, probs, idx, wg, wu, wd, state=state)  # builds the packed bank
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        y = fused_moe_experts(x, probs, idx, wg, wu, wd, state=state)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(y).all()
    check_alignment(idx, 256, 128)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("heads", "tokens"), [(3, 512), (3, 14601), (12, 4096)])
def test_gpu_stable_alignment_kernels_equal_the_torch_statement(heads: int, tokens: int) -> None:
    # Production-local shapes with the default chunk (1024 or 2048 routes per program).
    idx = torch.rand(heads, tokens, 256, device="cuda").argsort(dim=-1)[..., :6]
    rid = flat_route_experts(idx, 256)
    capacity = route_capacity(rid.numel(), heads * 256, 128)
    got = RouteBuffers.allocate(capacity, 128, heads * 256, rid.device)
    want = RouteBuffers.allocate(capacity, 128, heads * 256, rid.device)
    align_routes_device_stable(idx, 256, got)
    align_routes_stable(rid, heads * 256, want)
    padded = int(want.num_padded.item())
    assert int(got.num_padded.item()) == padded
    assert torch.equal(got.sorted_ids[:padded], want.sorted_ids[:padded])
    assert torch.equal(got.expert_ids[: padded // 128], want.expert_ids[: padded // 128])


@pytest.mark.gpu
@needs_cuda
def test_gpu_caches_follow_device_moves() -> None:
    idx = make_moe(5, 2, 4, 32, 32, 2, device="cpu")[2]
    state = MoEState()
    cpu_bufs = state.route_buffers(idx.numel(), 8, 16, torch.device("cpu"))
    assert state.route_buffers(idx.numel(), 8, 16, torch.device("cuda", 0)) is not cpu_bufs
    assert cpu_bufs.sorted_ids.device.type == "cpu"
