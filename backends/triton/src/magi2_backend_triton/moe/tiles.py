"""The fused MoE's kernel variants and launch sizes, read from a :class:`magi2_core.model.plan.Plan`.

A plan names a ``variant``, a ``tile`` (its launch sizes, by name) and an ``align`` (how the routes
reach the kernel); `plan.py` says which plan serves a problem, `fused.run_fused` launches it. This
module is the plan's vocabulary as typed values, and the only place that reads a plan's ``tile``.

Variants:

* ``two_kernel``: `kernels.gemm1_swiglu7_kernel` then `kernels.gemm2_weighted_kernel`, the
  intermediate through memory; every shape, every platform.
* ``one_kernel``: `kernels.fused_expert_kernel`, both GEMMs in one program per row block with the
  intermediate on chip; ``hidden`` a power of two and ``intermediate`` a multiple of ``BLOCK_I``.
* ``tma``: `kernels_tma.py`, the same with weight slices through tensor descriptors (CUDA >= 9.0, a
  Triton with host-side descriptors; the interpreter runs it on CPU).
* ``gluon``, ``gluon_routed``, ``gluon_ws``: `kernels_gluon.py` / `kernels_gluon_ws.py`, the slice
  loop software-pipelined by hand (Hopper, a Triton with Gluon): one program per aligned row block,
  one per flat expert over unpadded route lists, or persistent and warp-specialised.

Tile keys: the one-kernel variants take ``BLOCK_M``, ``BLOCK_I`` (intermediate slice), ``num_warps``
and ``num_stages``; ``two_kernel`` takes ``BLOCK_M`` and, per GEMM ``g`` in 1, 2, ``BLOCK_N{g}``,
``BLOCK_K{g}``, ``GROUP_M{g}``, ``num_warps{g}`` and ``num_stages{g}``. Both may add ``PACKED_W13``
(1, the default: gate/up are read from an interleaved ``[F, 2I, d]`` bank; 0: as given) and the
one-kernel variants ``INTERLEAVED`` (1, the default: one dot over the bank's interleaved gate/up
columns; 0: two half-width dots). Prepared weights are a bank already and are read in place; raw
gate/up have none, so a call with them runs the plan's raw step (`plan.without_bank`: 0 and 0).

Alignments: ``atomic`` (four kernels, routes in the order the atomics gave), ``stable_kernels`` (five
kernels without atomics, each expert's routes in route order; CUDA), ``stable_torch`` (the stable
order from torch ops) and ``lists`` (per-expert route lists, ``gluon_routed`` only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from magi2_core.backend import InvalidValueError, Plan

__all__ = [
    "ALIGNMENTS",
    "ONE_KERNEL",
    "VARIANTS",
    "Alignment",
    "GemmTile",
    "Launch",
    "SliceTile",
    "Variant",
    "launch_of",
]

Variant = Literal["two_kernel", "one_kernel", "tma", "gluon", "gluon_routed", "gluon_ws"]
VARIANTS: tuple[Variant, ...] = get_args(Variant)
ONE_KERNEL: tuple[Variant, ...] = VARIANTS[1:]
TENSOR_DESCRIPTORS: tuple[Variant, ...] = ("tma", "gluon", "gluon_routed", "gluon_ws")  # always read the bank
Alignment = Literal["atomic", "stable_kernels", "stable_torch", "lists"]
ALIGNMENTS: tuple[Alignment, ...] = get_args(Alignment)

_SLICE_KEYS = ("BLOCK_M", "BLOCK_I", "num_warps", "num_stages")
_GEMM_KEYS = ("BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
_TWO_KEYS = ("BLOCK_M", *(f"{k}{g}" for g in (1, 2) for k in _GEMM_KEYS))
_FLAGS = ("PACKED_W13", "INTERLEAVED")


@dataclass(frozen=True)
class GemmTile:
    """One GEMM of the two-kernel path (rows per block, output columns, reduction step, grouping, warps, stages)."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class SliceTile:
    """The one-kernel path: rows per block, intermediate slice width, warps, pipeline stages."""

    block_m: int
    block_i: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class Launch:
    """A plan as the launcher reads it: exactly one of ``single`` (one-kernel variants) and ``gemms``."""

    variant: Variant
    align: Alignment
    single: SliceTile | None
    gemms: tuple[GemmTile, GemmTile] | None
    packed_w13: bool
    interleaved_dot: bool

    @property
    def block_m(self) -> int:
        """The row block, which the route alignment pads each expert's routes to."""
        if self.single is not None:
            return self.single.block_m
        assert self.gemms is not None
        return self.gemms[0].block_m


def _bad(what: str, expected: str, actual: object) -> InvalidValueError:
    return InvalidValueError("moe_experts", f"plan.{what}", expected, repr(actual))


def launch_of(plan: Plan) -> Launch:
    """Read ``plan``: an error names the field that does not fit the vocabulary above."""
    if plan.variant not in VARIANTS:
        raise _bad("variant", f"one of {', '.join(VARIANTS)}", plan.variant)
    if plan.align not in ALIGNMENTS:
        raise _bad("align", f"one of {', '.join(ALIGNMENTS)}", plan.align)
    variant: Variant = plan.variant  # narrowed to the vocabulary by the checks above
    align: Alignment = plan.align
    if (align == "lists") != (variant == "gluon_routed"):
        raise _bad("align", "'lists' with gluon_routed, and only there", f"{align} with {variant}")
    tile = plan.tile
    keys = _TWO_KEYS if variant == "two_kernel" else _SLICE_KEYS
    flags = _FLAGS[:1] if variant == "two_kernel" else _FLAGS
    missing = [k for k in keys if k not in tile]
    extra = sorted(set(tile) - set(keys) - set(flags))
    if missing or extra:
        raise _bad("tile", f"the keys {', '.join(keys)} (optional: {', '.join(flags)}) for {variant}", dict(tile))
    if any(v < 1 for k, v in tile.items() if k not in _FLAGS) or any(tile.get(f, 1) not in (0, 1) for f in flags):
        raise _bad("tile", "positive sizes and 0/1 flags", dict(tile))
    packed, interleaved = bool(tile.get("PACKED_W13", 1)), bool(tile.get("INTERLEAVED", 1))
    if variant != "two_kernel":
        single = SliceTile(tile["BLOCK_M"], tile["BLOCK_I"], tile["num_warps"], tile["num_stages"])
        return Launch(variant, align, single, None, packed, interleaved)
    g1, g2 = (GemmTile(tile["BLOCK_M"], *(tile[f"{k}{g}"] for k in _GEMM_KEYS)) for g in (1, 2))
    return Launch(variant, align, None, (g1, g2), packed, False)
