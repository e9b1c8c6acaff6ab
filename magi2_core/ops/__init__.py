"""The public operators, one spec module each: validate, resolve (cached), run the chosen provider.

Each operator has one home (:mod:`~magi2_core.ops.attention`, :mod:`~magi2_core.ops.moe_route`,
:mod:`~magi2_core.ops.moe_experts`, :mod:`~magi2_core.ops.rmsnorm`, :mod:`~magi2_core.ops.mhc_pre`,
:mod:`~magi2_core.ops.mhc_mix`, :mod:`~magi2_core.ops.qk_norm_rope`, :mod:`~magi2_core.ops.output_gate`):
its public function, typed problem key, validation, kernel Protocol, ``torch.compile`` fake and acceptance rule
(:class:`~magi2_core.ops._spec.OpSpec`). The resolver, shadow verification, the conformance kit and
``magi2 explain`` loop over :data:`SPECS`; the conformance cases live in the kit
(:mod:`magi2_core.testing.op_cases`) and the ``explain`` fields in the CLI
(:mod:`magi2_core.cli._explain_fields`), so that the hot path imports neither.

Eager calls go straight to the provider's kernel; a repeated call layout (shapes, dtypes, devices,
scalar arguments) reuses its validation and resolution. Under ``torch.compile`` each public op is
recorded as one opaque ``torch.library`` custom op (``magi2::attention`` ...): the fake implementation
gives the output shapes, and validation and resolution run when the compiled graph executes, outside
the traced graph, with the ``compiling`` feature set (providers that are not safe there are skipped).
"""

from __future__ import annotations

from typing import Any

from magi2_core.errors import InvalidValueError
from magi2_core.model.problem import OPS, OpName
from magi2_core.ops._spec import OpSpec
from magi2_core.ops.attention import SPEC as ATTENTION
from magi2_core.ops.attention import attention
from magi2_core.ops.mhc_mix import SPEC as MHC_MIX
from magi2_core.ops.mhc_mix import mhc_mix
from magi2_core.ops.mhc_pre import SPEC as MHC_PRE
from magi2_core.ops.mhc_pre import mhc_pre
from magi2_core.ops.moe_experts import SPEC as MOE_EXPERTS
from magi2_core.ops.moe_experts import moe_experts, prepare_moe_weights
from magi2_core.ops.moe_route import SPEC as MOE_ROUTE
from magi2_core.ops.moe_route import moe_route
from magi2_core.ops.output_gate import SPEC as OUTPUT_GATE
from magi2_core.ops.output_gate import output_gate
from magi2_core.ops.qk_norm_rope import SPEC as QK_NORM_ROPE
from magi2_core.ops.qk_norm_rope import qk_norm_rope
from magi2_core.ops.rmsnorm import SPEC as RMSNORM
from magi2_core.ops.rmsnorm import rmsnorm
from magi2_core.reasons import Resolution
from magi2_core.selection.dispatch import dispatcher
from magi2_core.selection.resolver import resolve_problem

__all__ = [
    "SPECS",
    "attention",
    "dispatcher",
    "mhc_mix",
    "mhc_pre",
    "moe_experts",
    "moe_route",
    "output_gate",
    "prepare_moe_weights",
    "qk_norm_rope",
    "resolve",
    "rmsnorm",
]

SPECS: dict[OpName, OpSpec[Any, Any]] = {
    s.name: s for s in (ATTENTION, MOE_ROUTE, MOE_EXPERTS, RMSNORM, MHC_PRE, MHC_MIX, QK_NORM_ROPE, OUTPUT_GATE)
}
assert tuple(SPECS) == OPS, "one spec per operator, in the order of magi2_core.model.problem.OPS"


def resolve(op: str, *args: Any, **kwargs: Any) -> Resolution:
    """Resolve the call ``op(*args, **kwargs)`` without running a kernel; return its :class:`Resolution`.

    Takes the op's own arguments (including ``provider=``); raises the op's input errors, and a
    :class:`~magi2_core.errors.ResolutionError` carrying the Resolution when nothing can serve it.
    """
    spec = SPECS.get(op)  # type: ignore[call-overload]
    if spec is None:
        raise InvalidValueError("resolve", "op", "one of " + ", ".join(map(repr, SPECS)), repr(op))
    provider = kwargs.pop("provider", None)
    call = spec.validate_arguments(args, kwargs)
    return resolve_problem(spec.problem(call.key), provider)
