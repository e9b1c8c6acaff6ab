"""The call record a provider receives, built from the public op's arguments: for a backend's own tests.

A provider's kernel object is called with one validated, frozen record (``AttentionCall``,
``RouteCall``, ``ExpertsCall``, ``RMSNormCall``, ``MHCPreCall``, ``MHCMixCall``, ``QKNormRopeCall``,
``OutputGateCall``).
:func:`call_record` builds the record that the op would pass for ``op(*args, **kwargs)``, so that a test
can call a kernel object directly, without registering it:
``kernel(call_record("attention", q, k, v, cu, cu, sinks=sinks))``.
"""

from __future__ import annotations

from typing import Any, Literal, overload

from magi2_core.ops import SPECS
from magi2_core.ops.attention import AttentionCall
from magi2_core.ops.mhc_mix import MHCMixCall
from magi2_core.ops.mhc_pre import MHCPreCall
from magi2_core.ops.moe_experts import ExpertsCall
from magi2_core.ops.moe_route import RouteCall
from magi2_core.ops.output_gate import OutputGateCall
from magi2_core.ops.qk_norm_rope import QKNormRopeCall
from magi2_core.ops.rmsnorm import RMSNormCall

__all__ = ["call_record"]


@overload
def call_record(op: Literal["attention"], *args: Any, **kwargs: Any) -> AttentionCall: ...
@overload
def call_record(op: Literal["moe_route"], *args: Any, **kwargs: Any) -> RouteCall: ...
@overload
def call_record(op: Literal["moe_experts"], *args: Any, **kwargs: Any) -> ExpertsCall: ...
@overload
def call_record(op: Literal["rmsnorm"], *args: Any, **kwargs: Any) -> RMSNormCall: ...
@overload
def call_record(op: Literal["mhc_pre"], *args: Any, **kwargs: Any) -> MHCPreCall: ...
@overload
def call_record(op: Literal["mhc_mix"], *args: Any, **kwargs: Any) -> MHCMixCall: ...
@overload
def call_record(op: Literal["qk_norm_rope"], *args: Any, **kwargs: Any) -> QKNormRopeCall: ...
@overload
def call_record(op: Literal["output_gate"], *args: Any, **kwargs: Any) -> OutputGateCall: ...
def call_record(op: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """The validated record of the public call ``op(*args, **kwargs)`` (its arguments, without
    ``provider=``); raises the op's input errors as the call would."""
    spec = SPECS.get(op)  # type: ignore[call-overload]
    if spec is None:
        raise ValueError(f"unknown op {op!r}; one of {', '.join(SPECS)}")
    record: tuple[Any, ...] = spec.validate_arguments(args, kwargs)
    return record
