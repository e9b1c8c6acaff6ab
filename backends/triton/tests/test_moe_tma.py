"""Hopper (TMA) variants of the one-kernel fused MoE against the pointer kernel, bit for bit.

CPU: the Triton interpreter runs host-side tensor descriptors, so every variant runs there on small
shapes (`warp_specialize` is a scheduling hint the interpreter ignores; the persistent walk runs on
a pretend machine of 3 programs, so programs own several row blocks). Same tiles, same dot shapes
and the same FP32 operands: the outputs must equal the pointer kernel's exactly, and the
reference's within 1 BF16 ULP.
GPU (`gpu` marker, capability >= 9.0; `tma` and `tma_persistent`): real widths, bit-equal to the pointer kernel or, if the
compiler orders a reduction differently, within the contract (rel-L2 <= 3e-4 vs the FP32 reference).
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from magi2_backend_reference.moe import exact_moe_experts
from magi2_backend_triton.moe import MoEState
from magi2_backend_triton.moe.fused import run_fused
from magi2_backend_triton.moe.pack import pack_w13
from magi2_backend_triton.moe.tiles import KERNEL_VARIANTS, GemmTile, KernelVariant, MoETiles
from magi2_backend_triton.moe.tma import tma_unsupported_reason
from test_moe_fused import INTERPRET, make_moe, rel_l2

from magi2_core.contracts.acceptance import accept_moe_experts
from magi2_core.errors import InvalidValueError

# The Gluon kernel is GPU-only (test_moe_gluon.py).
TMA_VARIANTS: list[KernelVariant] = [v for v in KERNEL_VARIANTS if v != "pointer" and not v.startswith("gluon")]
_T16 = GemmTile(16, 16, 16, 4, 1)
POINTER = MoETiles(_T16, _T16, single=_T16, interleaved_dot=True)

CASES = {
    "odd_T": (7, 3, 5, 32, 48, 3),
    "T1": (1, 2, 4, 32, 32, 2),
    "many_blocks": (25, 2, 3, 32, 32, 2),  # > BM routes per expert: several blocks per expert
}


def _skip_without_triton_support(variant: KernelVariant) -> None:
    """Under the interpreter only the Triton version can refuse a variant (3.3 has no tensor descriptors)."""
    why = tma_unsupported_reason(torch.device("cpu"), variant)
    if why is not None:
        pytest.skip(why)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test (the GPU test below covers CUDA)")
@pytest.mark.parametrize("variant", TMA_VARIANTS)
@pytest.mark.parametrize("case", list(CASES))
def test_tma_variant_equals_pointer_kernel(case: str, variant: KernelVariant) -> None:
    _skip_without_triton_support(variant)
    x, probs, idx, wg, wu, wd = make_moe(*CASES[case])
    base = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), tiles=POINTER).y
    y = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), tiles=dataclasses.replace(POINTER, variant=variant)).y
    assert torch.equal(y, base)
    # Against the reference, the op's contract (the pointer kernel's own tests bound it tighter on
    # fixed seeds): a one-ULP bound is not guaranteed on fresh draws, because a different FP32
    # summation order can flip the rounding of one intermediate (seen once in ~10 CPU runs).
    verdict = accept_moe_experts(y, exact_moe_experts(x, probs, idx, wg, wu, wd), wg.shape[2])
    assert verdict.ok, verdict


@pytest.mark.skipif(not INTERPRET, reason="interpreter test")
def test_tma_variant_reads_prepared_bank_in_place() -> None:
    # Prepared weights are strided views of one packed bank: the descriptors must address the bank
    # itself (gate row 2i, up row 2i+1), not the view, and build no cached copy.
    _skip_without_triton_support("tma_persistent")
    x, probs, idx, wg, wu, wd = make_moe(9, 2, 3, 32, 32, 2)
    bank = pack_w13(wg, wu)
    gate_view, up_view = bank[:, 0::2, :].transpose(1, 2), bank[:, 1::2, :].transpose(1, 2)
    state = MoEState()
    tiles = dataclasses.replace(POINTER, variant="tma_persistent")
    y = run_fused(x, probs, idx, gate_view, up_view, wd, state=state, tiles=tiles).y
    assert state.w13.builds == 0
    assert torch.equal(y, run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), tiles=POINTER).y)


def test_tma_variant_rejected_off_hopper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    reason = tma_unsupported_reason(torch.device("cpu"), "tma")
    assert reason is not None and ("CUDA" in reason or "tensor_descriptor" in reason)  # this device, or this Triton
    if INTERPRET:
        x, probs, idx, wg, wu, wd = make_moe(3, 1, 2, 32, 32, 2)
        with pytest.raises(InvalidValueError, match=r"tiles\.variant"):
            run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), tiles=dataclasses.replace(POINTER, variant="tma"))


def test_unknown_variant_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown MoE kernel variant"):
        dataclasses.replace(POINTER, variant="tmaa")  # type: ignore[arg-type]


# ---- GPU ---------------------------------------------------------------------------------------


# The warp-specialised variants go through Triton 3.6's newest Hopper pass and are first proven by
# benchmarks/moe_sweep.py (which records a compile failure instead of stopping); one that the table
# adopts joins this list.
GPU_VARIANTS: list[KernelVariant] = ["tma", "tma_persistent"]


def _hopper() -> bool:
    return not INTERPRET and torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a CUDA GPU of capability >= 9.0")
@pytest.mark.parametrize("shape", [(1, 3, 256), (513, 3, 256), (4097, 3, 256)])
@pytest.mark.parametrize("variant", GPU_VARIANTS)
def test_gpu_tma_variant_matches_pointer_kernel(shape: tuple[int, int, int], variant: KernelVariant) -> None:
    tokens, heads, experts = shape
    x, probs, idx, wg, wu, wd = make_moe(tokens, heads, experts, 256, 1280, 6, device="cuda")
    bm = 16 if tokens * 6 / experts <= 16 else 128
    single = GemmTile(bm, 32, 64, 4 if bm == 16 else 8, 3)
    pointer = MoETiles(single, single, single=single, interleaved_dot=True)
    base = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), tiles=pointer).y
    y = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), tiles=dataclasses.replace(pointer, variant=variant)).y
    assert torch.isfinite(y).all()
    if not torch.equal(y, base):
        assert rel_l2(y, exact_moe_experts(x, probs, idx, wg, wu, wd)) <= 3e-4


@pytest.mark.gpu
@pytest.mark.skipif(not _hopper(), reason="needs a CUDA GPU of capability >= 9.0")
@pytest.mark.parametrize("layout", ["prepared", "raw"])
def test_gpu_tma_variant_in_cuda_graph(layout: str) -> None:
    # Prepared views: the TMA kernel is captured (descriptors by value). Raw gate/up inside a capture
    # have no packed bank (read in place): the pointer kernel is captured. Each replays bit-equal to
    # its kernel run eagerly.
    x, probs, idx, wg, wu, wd = make_moe(513, 3, 256, 256, 1280, 6, device="cuda")
    single = GemmTile(16, 32, 64, 4, 3)
    pointer = MoETiles(single, single, single=single, interleaved_dot=True)
    tiles = dataclasses.replace(pointer, variant="tma_persistent")
    bank = pack_w13(wg, wu)
    gate, up = (
        (bank[:, 0::2, :].transpose(1, 2), bank[:, 1::2, :].transpose(1, 2)) if layout == "prepared" else (wg, wu)
    )
    # The kernel the capture will run, eager (this also compiles it outside the capture): raw
    # weights read in place are the pointer kernel's two-dot form.
    eager_tiles = tiles if layout == "prepared" else dataclasses.replace(pointer, packed_w13=False)
    expected = run_fused(x, probs, idx, gate, up, wd, state=MoEState(), tiles=eager_tiles).y
    state = MoEState()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run_fused(x, probs, idx, gate, up, wd, state=state, tiles=tiles).y
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected)
