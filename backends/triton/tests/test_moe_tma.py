"""Hopper (TMA) variants of the one-kernel fused MoE against the `one_kernel` variant, bit for bit.

CPU: the Triton interpreter runs host-side tensor descriptors, so the kernel runs there on small
shapes. Same tiles, same dot shapes
and the same FP32 operands: the outputs must equal the `one_kernel` variant's exactly, and the
reference's within 1 BF16 ULP.
GPU (`gpu` marker, capability >= 9.0): real widths, bit-equal to the `one_kernel` variant or, if the
compiler orders a reduction differently, within the contract (rel-L2 <= 3e-4 vs the FP32 reference).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from magi2_backend_reference.moe import exact_moe_experts
from magi2_backend_triton.moe import MoEState
from magi2_backend_triton.moe.fused import run_fused
from magi2_backend_triton.moe.pack import pack_w13
from magi2_backend_triton.moe.tiles import SliceTile, launch_of
from magi2_backend_triton.moe.tma import tma_unsupported_reason
from test_moe_fused import INTERPRET, make_moe, one_kernel_plan, rel_l2

from magi2_core.contracts.acceptance import accept_moe_experts
from magi2_core.errors import InvalidValueError
from magi2_core.model.plan import Plan

# The Gluon kernel is GPU-only (test_moe_gluon.py).
_T16 = SliceTile(16, 16, 4, 1)
POINTER = one_kernel_plan("one_kernel", _T16)
TMA = one_kernel_plan("tma", _T16)

CASES = {
    "odd_T": (7, 3, 5, 32, 48, 3),
    "T1": (1, 2, 4, 32, 32, 2),
    "many_blocks": (25, 2, 3, 32, 32, 2),  # > BM routes per expert: several blocks per expert
}


def _skip_without_triton_support() -> None:
    """Under the interpreter only the Triton version can refuse the kernel (3.3 has no tensor descriptors)."""
    why = tma_unsupported_reason(torch.device("cpu"))
    if why is not None:
        pytest.skip(why)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (the GPU test below covers CUDA)")
@pytest.mark.parametrize("case", list(CASES))
def test_tma_variant_equals_the_one_kernel_variant(case: str) -> None:
    _skip_without_triton_support()
    x, probs, idx, wg, wu, wd = make_moe(*CASES[case])
    base = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=POINTER).y
    y = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=TMA).y
    assert torch.equal(y, base)
    # Against the reference, the op's contract (the `one_kernel` variant's own tests bound it tighter on
    # fixed seeds): a one-ULP bound is not guaranteed on fresh draws, because a different FP32
    # summation order can flip the rounding of one intermediate (seen once in ~10 CPU runs).
    verdict = accept_moe_experts(y, exact_moe_experts(x, probs, idx, wg, wu, wd), wg.shape[2])
    assert verdict.ok, verdict


@pytest.mark.skipif(not INTERPRET, reason="interpreter test")
def test_tma_variant_reads_prepared_bank_in_place(pack_count: Callable[[], int]) -> None:
    # Prepared weights are strided views of one packed bank: the descriptors must address the bank
    # itself (gate row 2i, up row 2i+1), not the view, and build no cached copy.
    _skip_without_triton_support()
    x, probs, idx, wg, wu, wd = make_moe(9, 2, 3, 32, 32, 2)
    bank = pack_w13(wg, wu)
    gate_view, up_view = bank[:, 0::2, :].transpose(1, 2), bank[:, 1::2, :].transpose(1, 2)
    packs = pack_count()
    y = run_fused(x, probs, idx, gate_view, up_view, wd, state=MoEState(), plan=TMA).y
    assert pack_count() == packs
    assert torch.equal(y, run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=POINTER).y)


def test_tma_variant_rejected_off_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = tma_unsupported_reason(torch.device("cpu"))
    assert reason is not None and ("CUDA" in reason or "tensor_descriptor" in reason)  # this device, or this Triton
    if INTERPRET:
        x, probs, idx, wg, wu, wd = make_moe(3, 1, 2, 32, 32, 2)
        with pytest.raises(InvalidValueError, match=r"plan\.variant"):
            run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=TMA)


@pytest.mark.parametrize("variant", ["tmaa", "tma_persistent", "tma_ws"])  # the last two left the package
def test_unknown_variant_is_rejected(variant: str) -> None:
    with pytest.raises(InvalidValueError, match=r"plan\.variant"):
        launch_of(Plan(variant=variant, tile=POINTER.tile, align="atomic", why="test"))


# ---- GPU ---------------------------------------------------------------------------------------


def _hopper() -> bool:
    return not INTERPRET and torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a CUDA GPU of capability >= 9.0")
@pytest.mark.parametrize("shape", [(1, 3, 256), (513, 3, 256), (4097, 3, 256)])
def test_gpu_tma_variant_matches_the_one_kernel_variant(shape: tuple[int, int, int]) -> None:
    tokens, heads, experts = shape
    x, probs, idx, wg, wu, wd = make_moe(tokens, heads, experts, 256, 1280, 6, device="cuda")
    bm = 16 if tokens * 6 / experts <= 16 else 128
    single = SliceTile(bm, 32, 4 if bm == 16 else 8, 3)
    base_plan = one_kernel_plan("one_kernel", single, "stable_kernels")
    base = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=base_plan).y
    y = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=one_kernel_plan("tma", single, "stable_kernels")).y
    assert torch.isfinite(y).all()
    if not torch.equal(y, base):
        assert rel_l2(y, exact_moe_experts(x, probs, idx, wg, wu, wd)) <= 3e-4


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a CUDA GPU of capability >= 9.0")
@pytest.mark.parametrize("layout", ["prepared", "raw"])
def test_gpu_tma_variant_in_cuda_graph(layout: str) -> None:
    # Prepared views: the TMA kernel is captured (descriptors by value). Raw gate/up inside a capture
    # have no packed bank (read in place): the plan's capture step (plan.without_bank) runs the `one_kernel`
    # kernel. Each replays bit-equal to its kernel run eagerly.
    x, probs, idx, wg, wu, wd = make_moe(513, 3, 256, 256, 1280, 6, device="cuda")
    single = SliceTile(16, 32, 4, 3)
    tiles = one_kernel_plan("tma", single, "stable_kernels")
    bank = pack_w13(wg, wu)
    gate, up = (
        (bank[:, 0::2, :].transpose(1, 2), bank[:, 1::2, :].transpose(1, 2)) if layout == "prepared" else (wg, wu)
    )
    # The kernel the capture will run, eager (this also compiles it outside the capture): raw
    # weights read in place are the `one_kernel` variant's two-dot form.
    eager_tiles = (
        tiles if layout == "prepared" else one_kernel_plan("one_kernel", single, "stable_kernels", PACKED_W13=0)
    )
    expected = run_fused(x, probs, idx, gate, up, wd, state=MoEState(), plan=eager_tiles).y
    state = MoEState()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run = run_fused(x, probs, idx, gate, up, wd, state=state, plan=tiles)
    out = run.y
    assert run.plan is not None and run.plan.variant == ("tma" if layout == "prepared" else "one_kernel")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
