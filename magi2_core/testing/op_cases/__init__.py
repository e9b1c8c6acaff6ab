"""The conformance cases of every operator, one module each, in the order of :data:`magi2_core.problem.OPS`."""

from __future__ import annotations

from magi2_core.problem import OPS, OpName
from magi2_core.testing.op_cases import attention, moe_experts, moe_route, rmsnorm
from magi2_core.testing.op_cases.base import OpCases

__all__ = ["CASES", "OpCases"]

CASES: dict[OpName, OpCases] = {c.op: c for c in (attention.CASES, moe_route.CASES, moe_experts.CASES, rmsnorm.CASES)}
assert tuple(CASES) == OPS, "one case generator per operator, in the order of magi2_core.problem.OPS"
