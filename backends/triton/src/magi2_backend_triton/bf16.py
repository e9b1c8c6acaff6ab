"""FP32 -> BF16 round-to-nearest-even by bit arithmetic, for the Triton interpreter.

The interpreter's FP32 -> BF16 cast truncates where the GPU's ``cvt`` rounds to nearest even, so
kernels that must store GPU-identical BF16 values call these under an interpreter-only constexpr.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["rne_bf16", "rne_bf16_bits"]


@triton.jit
def rne_bf16_bits(x):
    """The FP32 bit pattern (uint32) of the BF16 value nearest to FP32 ``x``, ties to even.

    The low 16 bits are zero; a NaN stays a (quiet) NaN, which the plain rounding could turn into inf.
    """
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, (bits | 0x400000) & 0xFFFF0000, rounded)


@triton.jit
def rne_bf16(x):
    """FP32 ``x`` rounded to BF16 (ties to even), as BF16."""
    # BF16 is the high half of FP32; a bitcast also sidesteps the interpreter's subnormal handling.
    return (rne_bf16_bits(x) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
