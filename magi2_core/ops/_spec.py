"""What every operator spec provides, and the few helpers the op modules share.

An op spec (one module per operator in :mod:`magi2_core.ops`) is the one home of its operator: the
public function and its docstring, the typed problem key, validation, the kernel Protocol, the
``torch.compile`` fake and the acceptance rule. The resolver, shadow verification, the conformance
kit and ``magi2 explain`` are loops over :data:`magi2_core.ops.SPECS` that call the methods below
and never switch on the op's name. The op's integer problem fields are data in
:data:`magi2_core.model.problem.OP_INT_FIELDS` (the registry and the profiles check descriptors against
them without importing the ops); a spec's key type is checked against them when it is defined.

The typed problem key of an op is a ``NamedTuple`` whose first four fields are :data:`HEAD` (device,
dtype, out_dtype, feature mask) and whose other fields are the op's integer problem fields, by their
:class:`~magi2_core.model.problem.Problem` names: the dispatcher buckets those by name, and a capability
descriptor may name only fields that its op's key (or :data:`COMMON_FIELDS`) has.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import torch

from magi2_core.contracts import _checks as checks
from magi2_core.contracts.acceptance import Acceptance
from magi2_core.errors import InvalidValueError
from magi2_core.model.capability import Capability, descriptor_errors
from magi2_core.model.problem import COMMON_FIELDS, HEAD, OP_INT_FIELDS, OpName, Problem, features_from_mask, op_fields
from magi2_core.ops._args import Args

__all__ = ["COMMON_FIELDS", "HEAD", "Accept", "CallT", "KeyT", "OpSpec", "dense", "forward_only"]

CallT = TypeVar("CallT", bound=tuple[Any, ...])
KeyT = TypeVar("KeyT", bound=tuple[Any, ...])


def forward_only(op: str, **tensors: torch.Tensor | None) -> None:
    """No provider implements backward: refuse a tensor that asks for gradients instead of dropping them."""
    for arg, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise InvalidValueError(
                op,
                arg,
                "a tensor that does not require grad (magi2 ops are forward-only: call them under "
                "torch.no_grad() or torch.inference_mode(), or pass .detach())",
                "requires_grad=True",
            )


def dense(t: torch.Tensor) -> torch.Tensor:
    """What the fake implementations promise under torch.compile: a contiguous result (a provider may
    return x's strides for a non-contiguous x; the copy happens only then, and only in compiled graphs)."""
    return t if t.is_contiguous() else t.contiguous()


Accept = Callable[[Any, Mapping[str, torch.Tensor], Mapping[str, torch.Tensor], Any], list[Acceptance]]
"""An op's acceptance rule: ``(problem, got, ref, call) -> [Acceptance]``, ``got`` against the reference's
``ref`` (``problem``: the key or Problem) for the validated ``call`` that produced both (a rule may judge
against a truth of the inputs)."""


class OpSpec(Generic[CallT, KeyT]):
    """Everything the generic machinery needs to know about one operator.

    ``CallT`` is the op's validated call record (a frozen NamedTuple of normalised inputs ending in
    ``key``; a provider's kernel receives it whole), ``KeyT`` its typed problem key (``key_type``, checked
    against :data:`~magi2_core.model.problem.OP_INT_FIELDS` here). ``args``: the op's declared arguments;
    ``validator``: its validation (``validate(*positional, **keywords, compiling=)``); ``outputs``: the
    names of its result (one tensor, or a tuple's entries in order); ``accept``: its acceptance rule.
    """

    def __init__(
        self,
        args: Args,
        key_type: type[KeyT],
        validator: Callable[..., CallT],
        *,
        outputs: tuple[str, ...],
        accept: Accept,
    ) -> None:
        self.name: OpName = args.op  # type: ignore[assignment]
        fields = key_type._fields  # type: ignore[attr-defined]
        if fields[: len(HEAD)] != HEAD or fields[len(HEAD) :] != OP_INT_FIELDS[self.name]:
            raise TypeError(
                f"{key_type.__name__} fields {fields} are not HEAD + "
                f"magi2_core.model.problem.OP_INT_FIELDS[{self.name!r}] {HEAD + OP_INT_FIELDS[self.name]}"
            )
        self.args = args
        self.key_type = key_type
        self.validator = validator
        self.arg_names: tuple[str, ...] = args.positional  # the public function's positional arguments
        self.output_names = outputs
        self._accept = accept

    def __repr__(self) -> str:
        return f"OpSpec({self.name!r})"

    # -- the problem ---------------------------------------------------------------------------
    @property
    def int_fields(self) -> tuple[str, ...]:
        """The op's integer problem fields, in key order (what the dispatcher buckets)."""
        return OP_INT_FIELDS[self.name]

    @property
    def fields(self) -> frozenset[str]:
        """Every :class:`Problem` field a descriptor of this op may name (ranges, rule conditions)."""
        return op_fields(self.name)

    @property
    def has_out_dtype(self) -> bool:
        return "out_dtype" in self.fields

    def descriptor_errors(self, cap: Capability) -> list[str]:
        """Why ``cap`` cannot be a descriptor of this op (:func:`~magi2_core.model.capability.descriptor_errors`)."""
        return descriptor_errors(cap)

    def problem(self, key: KeyT) -> Problem:
        """The public :class:`Problem` of a typed key (what descriptors, rules and ``explain`` see)."""
        device, dtype, out_dtype, mask = key[:4]
        device_type, device_index = checks.device_fields(device)
        return Problem(
            op=self.name,
            device_type=device_type,
            device_index=device_index,
            dtype=str(dtype),
            out_dtype=None if out_dtype is None else str(out_dtype),
            features=features_from_mask(int(mask)),
            **dict(zip(self.int_fields, key[4:], strict=True)),
        )

    # -- calls ---------------------------------------------------------------------------------
    def validate_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> CallT:
        """Validate the public function's own arguments (without ``provider``), as the op does."""
        call: CallT = self.args.validate_arguments(self.validator, args, kwargs)
        return call

    def run(self, kernel: Any, call: CallT) -> Any:
        """Call a provider's kernel object with a validated call (what shadow re-runs on the reference):
        every provider receives the one record, ``kernel(call)``."""
        return kernel(call)

    def outputs(self, out: Any) -> dict[str, torch.Tensor]:
        """A public or provider result as named tensors (an output not asked for, None, is left out)."""
        if not isinstance(out, (tuple, list)):
            return {self.output_names[0]: out}
        return {name: t for name, t in zip(self.output_names, out, strict=True) if t is not None}

    def accept(
        self, problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: CallT
    ) -> list[Acceptance]:
        """The op's acceptance rule (:data:`Accept`) on ``got`` against ``ref``."""
        return self._accept(problem, got, ref, call)
