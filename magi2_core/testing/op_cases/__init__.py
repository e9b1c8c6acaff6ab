"""Conformance cases generated from a provider's capability descriptor, one module per operator.

A :class:`~magi2_core.testing.cases.Case` is a small, hashable description of one call (sizes,
features, dtype, device); the tensors are built from it later by :mod:`magi2_core.testing.inputs`,
seeded per case, so any case reproduces alone. Each op's module here generates its cases: every
claimed dtype, head dim (a small default set when the descriptor does not restrict it), feature and
integer range, plus the edge layouts of the contract (ragged and empty segments, T = 0, empty
modality groups). Cases outside a claimed *range* are not generated; cases that a *rule* makes
ineligible are kept, and reported as ineligible rather than run. :data:`CASES` has one generator per
operator, in the order of :data:`magi2_core.model.problem.OPS`.
"""

from __future__ import annotations

from magi2_core.model.capability import Capability
from magi2_core.model.problem import OPS, OpName, Problem
from magi2_core.reasons import ReasonCode
from magi2_core.selection.resolver import static_reasons
from magi2_core.testing.cases import Case
from magi2_core.testing.op_cases import (
    attention,
    mhc_mix,
    mhc_pre,
    moe_experts,
    moe_route,
    output_gate,
    qk_norm_rope,
    rmsnorm,
)
from magi2_core.testing.op_cases.base import OpCases

__all__ = ["CASES", "DEFAULT_MAX_TOKENS", "OpCases", "generate_cases", "problem_of"]

CASES: dict[OpName, OpCases] = {
    c.op: c
    for c in (
        attention.CASES,
        moe_route.CASES,
        moe_experts.CASES,
        rmsnorm.CASES,
        mhc_pre.CASES,
        mhc_mix.CASES,
        qk_norm_rope.CASES,
        output_gate.CASES,
    )
}
assert tuple(CASES) == OPS, "one case generator per operator, in the order of magi2_core.model.problem.OPS"

# Boundary layouts longer than this are not generated (CPU CI stays fast); a range whose minimum is
# larger is still served with one case at its minimum, so every claimed region gets a case.
DEFAULT_MAX_TOKENS = 256


def problem_of(case: Case) -> Problem:
    """The :class:`Problem` the op will build for ``case`` (what selection sees)."""
    return CASES[case.op].case_problem(case)


def _in_ranges(cap: Capability, case: Case) -> bool:
    return not any(r.code == ReasonCode.RANGE for r in static_reasons(cap, problem_of(case)))


def generate_cases(cap: Capability, device: str, *, max_tokens: int = DEFAULT_MAX_TOKENS) -> list[Case]:
    """Every case of ``cap`` on ``device`` inside the claimed ranges, in a stable order, no duplicates."""
    seen: dict[str, Case] = {}
    for c in CASES[cap.op].cases(cap, device, max_tokens):
        if c.id not in seen and _in_ranges(cap, c):
            seen[c.id] = c
    return list(seen.values())
