"""Conformance cases generated from a provider's capability descriptor, by its op's case module.

A :class:`Case` is a small, hashable description of one call (sizes, features, dtype, device); the
tensors are built from it later by :mod:`magi2_core.testing.inputs`, seeded per case, so any case
reproduces alone. Each op's case module (:mod:`magi2_core.testing.op_cases`) generates its cases: every claimed dtype, head
dim (a small default set when the descriptor does not restrict it), feature and integer range, plus
the edge layouts of the contract (ragged and empty segments, T = 0, empty modality groups). Cases
outside a claimed *range* are not generated; cases that a *rule* makes ineligible are kept, and
reported as ineligible rather than run.
"""

from __future__ import annotations

from magi2_core.capability import Capability
from magi2_core.problem import Problem
from magi2_core.resolution import ReasonCode
from magi2_core.resolver import static_reasons
from magi2_core.testing.case import Case
from magi2_core.testing.op_cases import CASES

__all__ = ["DEFAULT_MAX_TOKENS", "Case", "generate_cases", "problem_of"]

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
