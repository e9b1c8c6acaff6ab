"""Per-platform tile table for the fused MoE GEMMs.

Keyed by (device type, compute capability) and by how many routes each flat expert receives on
average, because that decides the padding waste of a row block: at 512 tokens an expert sees ~12
routes, so a 128-row block would be 90% padding and the call turns into wasted matrix work, while
at 14,601 tokens (~340 routes per expert) big blocks keep the tensor cores fed.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass, replace
from typing import Literal

import torch

# Kernel of the one-kernel path. "pointer": `kernels.fused_expert_kernel`, every platform. The
# others are the Hopper variants of `kernels_tma.py` (weight slices through tensor descriptors),
# for CUDA capability >= 9.0 only: "tma" one program per row block, "tma_ws" the same with a
# warp-specialised slice loop, "tma_persistent" / "tma_persistent_ws" a machine-sized grid walking
# the row blocks. "gluon" is `kernels_gluon.py`: the TMA kernel's operands with the slice loop
# software-pipelined by hand (Hopper, Triton with Gluon); "gluon_routed" the same row-block body
# with one program per flat expert reading unpadded route lists (`align.ExpertLists`: one scatter
# kernel instead of the alignment's four); "gluon_ws" (`kernels_gluon_ws.py`) the aligned kernel,
# persistent and warp-specialised: a loader warp and two independent 64-row consumer warpgroups.
# The launchers reject a variant where the device or Triton lacks the feature.
KernelVariant = Literal[
    "pointer", "tma", "tma_ws", "tma_persistent", "tma_persistent_ws", "gluon", "gluon_routed", "gluon_ws"
]
KERNEL_VARIANTS: tuple[KernelVariant, ...] = (
    "pointer",
    "tma",
    "tma_ws",
    "tma_persistent",
    "tma_persistent_ws",
    "gluon",
    "gluon_routed",
    "gluon_ws",
)


@dataclass(frozen=True)
class GemmTile:
    """One GEMM launch config (rows per block, output columns, reduction step, warps, stages)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    group_m: int = 8


@dataclass(frozen=True)
class MoETiles:
    """Tiles for both GEMMs; they share block_m because they share the route alignment."""

    gemm1: GemmTile
    gemm2: GemmTile
    # True: GEMM1 reads the cached interleaved [F, 2I, d] bank; False: it reads w_gate/w_up as given.
    packed_w13: bool = True
    # When set (block_n = intermediate slice), both GEMMs run in one kernel and the intermediate
    # stays on chip; used where d is a power of two and I a multiple of the slice.
    single: GemmTile | None = None
    # One-kernel path with the packed bank: one dot over the interleaved (gate, up) columns
    # instead of two half-width dots.
    interleaved_dot: bool = False
    # Kernel of the one-kernel path (see KernelVariant); TMA variants always read the packed bank.
    variant: KernelVariant = "pointer"
    # Persistent variants: programs per SM (the grid is this times the SM count, at most one
    # program per row block); sized so that the programs of one wave are resident together.
    ctas_per_sm: int = 1

    def __post_init__(self) -> None:
        if self.gemm1.block_m != self.gemm2.block_m:
            raise ValueError("gemm1 and gemm2 share the route alignment, so they need one block_m")
        if self.variant not in KERNEL_VARIANTS:
            raise ValueError(f"unknown MoE kernel variant {self.variant!r}; expected one of {KERNEL_VARIANTS}")
        if self.ctas_per_sm < 1:
            raise ValueError(f"ctas_per_sm must be >= 1; got {self.ctas_per_sm}")

    @property
    def block_m(self) -> int:
        """Row block of the preferred path (the launcher falls back to gemm1's when needed)."""
        return self.single.block_m if self.single is not None else self.gemm1.block_m


# Upstream #7206 tiles (H20 sweep, CUDA) and the MUSA k-tile; kept as the portable defaults.
_UPSTREAM_CUDA = MoETiles(GemmTile(128, 128, 32, 4, 3, 16), GemmTile(128, 128, 32, 4, 3, 16))
_UPSTREAM_MUSA = MoETiles(GemmTile(128, 128, 64, 16, 1, 16), GemmTile(128, 128, 64, 16, 1, 16))

# (upper bound of mean routes per expert, tiles), first match wins. Picked from the sweeps on one
# H200 (benchmarks/results/moe_h200.json, docs/moe-notes.md): the one-kernel path wins at every
# measured size. Few routes per expert: 16-row blocks (padding is the cost, the call is a weight
# stream); more routes: bigger blocks so each expert's weights stream through fewer programs.
# The two-kernel tiles serve shapes the one-kernel path cannot take (d not a power of two, I not
# a multiple of the slice).
_TWO_SMALL = MoETiles(GemmTile(16, 32, 64, 4, 4), GemmTile(16, 64, 64, 4, 4))
_TWO_MID = MoETiles(GemmTile(64, 128, 32, 4, 4), GemmTile(64, 128, 64, 4, 3), packed_w13=False)
_TWO_LARGE = MoETiles(GemmTile(128, 128, 32, 8, 4), GemmTile(128, 256, 64, 8, 3))
# Each row lists its tiles best first; the first whose kernel this Triton can build is used.
_H200: tuple[tuple[float, tuple[MoETiles, ...]], ...] = (
    # T=512 and T=2048: one Gluon program per expert over unpadded route lists (one scatter kernel,
    # no row-block alignment; benchmarks/results/moe_sweep_pdl_h200.json: 0.366 ms against 0.376
    # for the aligned Gluon kernel and 0.388 for the pointer kernel at 512; 0.387 against 0.394 and
    # 0.401 at 2048).
    (16.0, (
        replace(_TWO_SMALL, single=GemmTile(64, 32, 64, 4, 3), interleaved_dot=True, variant="gluon_routed"),
        replace(_TWO_SMALL, single=GemmTile(64, 32, 64, 4, 3), interleaved_dot=True, variant="gluon"),
        replace(_TWO_SMALL, single=GemmTile(16, 32, 64, 4, 4)),
    )),
    (64.0, (
        replace(_TWO_MID, packed_w13=True, single=GemmTile(64, 32, 64, 4, 3), interleaved_dot=True, variant="gluon_routed"),
        replace(_TWO_MID, packed_w13=True, single=GemmTile(64, 32, 64, 4, 3), interleaved_dot=True),
    )),
    # T=4096, 14601 and 12 heads at 4096, one 128-row tile: the persistent warp-specialised Gluon
    # kernel, bit-equal to the others (moe_sweep_ws_persistent_h200.json: 0.432 / 1.145 / 1.712 ms
    # against 0.447 / 1.283 / 1.813 for the 8-warp Gluon kernel), which was 1-4% faster than the TMA
    # kernel (moe_sweep_gluon_h200.json), itself 3-5% faster than the pointer kernel
    # (moe_sweep_h200.json). The per-expert kernel loses here (moe_sweep_pdl_h200.json): an expert
    # with more than one row block runs them one after another in one program.
    (float("inf"), tuple(
        replace(_TWO_LARGE, single=GemmTile(128, 32, 64, 8, 3), interleaved_dot=True, variant=v)
        for v in ("gluon_ws", "gluon", "tma", "pointer")
    )),
)  # fmt: skip

# FP32 activations: IEEE FP32 dots (no tensor cores) with twice the bytes per element, so small
# two-kernel tiles that stay well inside shared memory and registers on every target.
_FP32 = MoETiles(GemmTile(32, 64, 32, 4, 2), GemmTile(32, 64, 32, 4, 2))

# CPU runs only under TRITON_INTERPRET=1 (tests): small tiles, and the one-kernel interleaved path
# (the H200 default) where the shape allows it: the interpreter pays per program, and this path
# launches ~4x fewer than the two-kernel one (3 s against 12 s per conformance-kit call).
_INTERPRETER = MoETiles(
    GemmTile(16, 16, 16, 4, 1), GemmTile(16, 16, 16, 4, 1), single=GemmTile(16, 32, 16, 4, 1), interleaved_dot=True
)


@functools.lru_cache(maxsize=1)
def _has_descriptors() -> bool:
    """Triton >= 3.4 ships host-side tensor descriptors; older ones keep the pointer kernel."""
    return importlib.util.find_spec("triton.tools.tensor_descriptor") is not None


def _has_gluon() -> bool:
    """This Triton builds the Gluon kernel (its Hopper API as the kernel uses it)."""
    from .gluon import gluon_import_error  # the launcher imports this module

    return gluon_import_error() is None


def _buildable(tiles: MoETiles, shape: tuple[int, int] | None) -> bool:
    """This Triton builds the tiles' kernel, and (Gluon) the kernel takes ``shape`` = (d, I)."""
    if tiles.variant == "pointer":
        return True
    if not tiles.variant.startswith("gluon"):
        return _has_descriptors()
    if not _has_gluon():
        return False
    from .gluon import gluon_shape_reason

    assert tiles.single is not None
    return shape is None or gluon_shape_reason(shape[0], shape[1], torch.bfloat16, tiles.single, tiles.variant) is None


def select_tiles(
    device_type: str,
    capability: tuple[int, int] | None,
    routes_per_expert: float,
    *,
    wide: bool = False,
    shape: tuple[int, int] | None = None,
) -> MoETiles:
    """Pick the tiles for one call; a host-side decision from shapes only (no device sync).

    ``wide``: 4-byte (FP32) activations; 2-byte ones (BF16, FP16) share the measured table.
    ``shape``: the call's (d, I); a table entry whose kernel cannot take it is passed over (None:
    the production shape is assumed, as the benchmarks do).
    """
    if device_type == "cpu":
        return _INTERPRETER
    if wide:
        return _FP32
    if device_type == "musa":
        return _UPSTREAM_MUSA
    if device_type == "cuda" and capability is not None and capability[0] == 9:
        for bound, choices in _H200:
            if routes_per_expert <= bound:
                return next(t for t in choices if _buildable(t, shape))  # every row ends with a pointer tile
    return _UPSTREAM_CUDA
