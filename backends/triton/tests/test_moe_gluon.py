"""The Gluon one-kernel fused MoE (Hopper): its gates on CPU, its results on the GPU.

The Triton interpreter cannot run Gluon, so on CPU only the decisions are tested: which shapes,
devices and Tritons it refuses (each with a reason, raised when asked for anyway). On a Hopper GPU
(`gpu` marker) it must equal the `one_kernel` variant with the same row block bit for bit (same operands,
same wgmma shapes, same rounding schedule), in eager mode, deterministic mode, FP16 and inside a
CUDA graph; otherwise the contract (rel-L2 <= 3e-4 against the FP32 reference) decides.
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Callable

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from magi2_backend_reference.moe import exact_moe_experts
from magi2_backend_triton.moe import MoEState
from magi2_backend_triton.moe.fused import run_fused, run_plan
from magi2_backend_triton.moe.gluon import gluon_shape_reason, gluon_unsupported_reason
from magi2_backend_triton.moe.pack import pack_w13
from magi2_backend_triton.moe.tiles import SliceTile
from test_moe_fused import INTERPRET, make_moe, one_kernel_plan, rel_l2

from magi2_core.errors import InvalidValueError
from magi2_core.model.plan import Plan

TILE128 = SliceTile(128, 32, 8, 3)
# per aligned row block; per expert over route lists; per aligned row block, warp-specialised
VARIANTS = ("gluon", "gluon_routed", "gluon_ws")
TILE64 = SliceTile(64, 32, 4, 3)


def gluon_plan(variant: str, tile: SliceTile, align: str = "atomic") -> Plan:
    return one_kernel_plan(variant, tile, "lists" if variant == "gluon_routed" else align)


@pytest.mark.parametrize(
    ("d", "inter", "dtype", "tile", "why"),
    [
        (256, 1280, torch.float32, TILE128, "2-byte activations"),
        (192, 1280, torch.bfloat16, TILE128, "d must be 128 or 256"),
        (64, 1280, torch.bfloat16, TILE128, "d must be 128 or 256"),
        (256, 80, torch.bfloat16, TILE128, "at least 3 slices"),
        (256, 1296, torch.bfloat16, TILE128, "at least 3 slices"),
        (256, 1280, torch.bfloat16, dataclasses.replace(TILE128, num_warps=4), "one warp per 16 rows"),
        (256, 1280, torch.bfloat16, dataclasses.replace(TILE128, block_m=16, num_warps=1), "one warp per 16 rows"),
        (256, 1280, torch.bfloat16, dataclasses.replace(TILE128, num_stages=1), "at least 2 stages"),
        (256, 1280, torch.bfloat16, dataclasses.replace(TILE128, num_stages=4), "shared memory"),
        (256, 1280, torch.bfloat16, dataclasses.replace(TILE128, block_i=64), "shared memory"),
    ],
)
def test_shape_gate_names_the_reason(d: int, inter: int, dtype: torch.dtype, tile: SliceTile, why: str) -> None:
    for variant in VARIANTS:
        reason = gluon_shape_reason(d, inter, dtype, tile, variant)
        assert reason is not None and why in reason


def test_shape_gate_of_the_warp_specialised_kernel() -> None:
    # two 64-row consumers: 128-row blocks only
    assert gluon_shape_reason(256, 1280, torch.bfloat16, TILE128, "gluon_ws") is None
    reason = gluon_shape_reason(256, 1280, torch.bfloat16, TILE64, "gluon_ws")
    assert reason is not None and "128-row blocks" in reason
    assert gluon_shape_reason(256, 1280, torch.bfloat16, TILE64, "gluon") is None


@pytest.mark.parametrize("tile", [TILE128, TILE64, dataclasses.replace(TILE64, block_i=16)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_shape_gate_takes_the_table_tiles(tile: SliceTile, dtype: torch.dtype) -> None:
    assert gluon_shape_reason(256, 1280, dtype, tile) is None
    assert gluon_shape_reason(128, 96, dtype, tile) is None


def test_device_gate_names_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    if INTERPRET:
        assert "interpreter" in (gluon_unsupported_reason(torch.device("cpu")) or "")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "CUDA device" in (gluon_unsupported_reason(torch.device("cpu")) or "")


@pytest.mark.skipif(not INTERPRET, reason="interpreter test")
@pytest.mark.parametrize("variant", ["gluon", "gluon_routed", "gluon_ws"])
def test_asking_for_it_where_it_cannot_run_raises(variant: str) -> None:
    # No silent fallback: the caller named the variant, so the refusal says why.
    x, probs, idx, wg, wu, wd = make_moe(7, 2, 3, 128, 96, 2)
    plan = gluon_plan(variant, TILE128)
    with pytest.raises(InvalidValueError, match="interpreter cannot run Gluon"):
        run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=plan)  # the launcher refuses
    with pytest.raises(InvalidValueError, match="interpreter cannot run Gluon"):
        run_plan(x, probs, idx, wg, wu, wd, plan)  # and the plan is refused before any launch


@pytest.mark.skipif(not INTERPRET, reason="interpreter test")
@pytest.mark.parametrize("variant", ["gluon", "gluon_ws"])
@pytest.mark.parametrize(("alignment", "pdl"), [("atomic", True), ("stable_kernels", True), ("stable_torch", False)])
def test_dependent_launch_follows_the_alignment_that_ran(
    monkeypatch: pytest.MonkeyPatch, variant: str, alignment: str, pdl: bool
) -> None:
    # The row-block kernels read the padded count before griddepcontrol.wait: programmatic dependent
    # launch is safe right after an alignment's scatter kernel only (the atomic and the stable
    # kernels end with one), never after the torch statement of the stable alignment.
    from magi2_backend_triton.moe import fused, gluon

    seen: list[tuple[str, bool]] = []

    class Kernel:  # records its launch's launch_pdl in place of launching
        def __getitem__(self, grid: object) -> Callable[..., None]:
            return lambda *a, launch_pdl, **k: seen.append(("pdl", launch_pdl))

    kernels = types.SimpleNamespace(fused_expert_gluon_kernel=Kernel(), fused_expert_gluon_ws_kernel=Kernel())
    monkeypatch.setattr(fused, "_align", lambda *a: seen.append(("align", a[-1] == alignment)))
    monkeypatch.setattr(gluon, "_checked_kernels", lambda *a: kernels)
    monkeypatch.setattr(gluon, "_descriptors", lambda *a: ("w13 descriptor", "down descriptor"))
    monkeypatch.setattr(gluon, "_sm_count", lambda device: 132)
    x, probs, idx, wg, wu, wd = make_moe(7, 2, 3, 128, 96, 2)
    run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=gluon_plan(variant, TILE128, alignment))
    assert seen == [("align", True), ("pdl", pdl)]


# ---- GPU ---------------------------------------------------------------------------------------


def _hopper() -> bool:
    return not INTERPRET and torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


needs_hopper = pytest.mark.skipif(not _hopper(), reason="needs a Hopper GPU (compute capability 9.x)")


def _pair(tile: SliceTile, variant: str = "gluon") -> tuple[Plan, Plan]:
    if variant == "gluon_ws" and tile.block_m != 128:
        pytest.skip("the warp-specialised kernel takes 128-row blocks only (its refusal is a CPU test)")
    return one_kernel_plan("one_kernel", tile, "stable_kernels"), gluon_plan(variant, tile, "stable_kernels")


def _check(y: torch.Tensor, base: torch.Tensor, ref: torch.Tensor) -> None:
    assert torch.isfinite(y).all()
    if not torch.equal(y, base):
        assert rel_l2(y, ref) <= 3e-4


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(
    "shape",
    [
        (1, 3, 256, 256, 1280, 6),
        (513, 3, 256, 256, 1280, 6),
        (4097, 3, 256, 256, 1280, 6),
        (37, 2, 8, 128, 96, 2),
        (300, 1, 4, 128, 1280, 3),
    ],
)
@pytest.mark.parametrize("tile", [TILE128, TILE64], ids=["m128", "m64"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_gluon_equals_the_one_kernel_variant(
    shape: tuple[int, ...], tile: SliceTile, dtype: torch.dtype, variant: str
) -> None:
    # (300, 1, 4, ...): 225 routes per expert, so the per-expert kernel walks several row blocks.
    tokens, heads, experts, d, inter, topk = shape
    x, probs, idx, *w = make_moe(tokens, heads, experts, d, inter, topk, device="cuda")
    x, wg, wu, wd = x.to(dtype), *(t.to(dtype) for t in w)
    base_plan, gluon = _pair(tile, variant)
    base = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=base_plan).y
    y = run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=gluon).y
    _check(y, base, exact_moe_experts(x, probs, idx, wg, wu, wd))


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_gluon_deterministic_runs_repeat_bitwise(variant: str) -> None:
    x, probs, idx, wg, wu, wd = make_moe(1000, 3, 64, 256, 1280, 6, device="cuda")
    _, gluon = _pair(TILE128, variant)
    runs = [run_fused(x, probs, idx, wg, wu, wd, state=MoEState(), plan=gluon, deterministic=True).y for _ in range(2)]
    assert torch.equal(runs[0], runs[1])


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_gluon_prepared_weights_in_cuda_graph(variant: str, pack_count: Callable[[], int]) -> None:
    # Prepared views of one packed bank: the kernel is captured with its descriptors by value and
    # replays bit-equal to the same kernel run eagerly, on new inputs copied into the static ones.
    x, probs, idx, wg, wu, wd = make_moe(513, 3, 256, 256, 1280, 6, device="cuda")
    bank = pack_w13(wg, wu)
    gate, up = bank[:, 0::2, :].transpose(1, 2), bank[:, 1::2, :].transpose(1, 2)
    _, gluon = _pair(TILE128 if variant == "gluon_ws" else TILE64, variant)
    state, packs = MoEState(), pack_count()
    run_fused(x, probs, idx, gate, up, wd, state=state, plan=gluon)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = run_fused(x, probs, idx, gate, up, wd, state=state, plan=gluon).y
    x2, probs2, idx2, *_ = make_moe(513, 3, 256, 256, 1280, 6, device="cuda")  # fresh draws
    x.copy_(x2), probs.copy_(probs2), idx.copy_(idx2)
    graph.replay()
    assert torch.equal(y, run_fused(x, probs, idx, gate, up, wd, state=MoEState(), plan=gluon).y)
    assert pack_count() == packs  # the prepared bank is read in place
