"""Tensors for a :class:`~magi2_core.testing.op_cases.Case`, and a few deliberately invalid calls.

Inputs are drawn on the CPU from a generator seeded per case and then moved to the case's device, so
a case gives the same numbers on every device and alone (``--magi2-seed`` plus the case id). Values
are fresh normal draws, never zeros; scales keep softmax, SwiGLU clamps and RMS statistics active.
What to draw is each op's case module's business (:meth:`~magi2_core.testing.op_cases.OpCases.build`).
"""

from __future__ import annotations

import torch

from magi2_core.ops import SPECS
from magi2_core.testing.cases import Call, Case, dtype_of
from magi2_core.testing.op_cases import CASES

__all__ = ["ARG_NAMES", "Call", "build_call", "dtype_of", "invalid_calls"]

ARG_NAMES: dict[str, tuple[str, ...]] = {op: spec.arg_names for op, spec in SPECS.items()}


def build_call(case: Case, seed: int) -> Call:
    """The case's arguments, on the case's device."""
    g = torch.Generator().manual_seed(seed)
    return CASES[case.op].build(case, g).to(case.device)


def invalid_calls(op: str, dtype: str, device: str, seed: int) -> dict[str, Call]:
    """Calls that the op contract must reject with an input error, by what is wrong with them."""
    g = torch.Generator().manual_seed(seed)
    dt = dtype_of(dtype)
    other = torch.float16 if dt != torch.float16 else torch.bfloat16
    out = CASES[op].invalid_calls(dt, other, g)  # type: ignore[index]
    return {name: call.to(device) for name, call in out.items()}
