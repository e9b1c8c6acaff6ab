"""An op's ``torch.library`` custom op (``magi2::<op>``), registered from its declared arguments.

Under ``torch.compile`` each public op is recorded as one opaque custom op: the fake gives the output
shapes, and validation (with the ``compiling`` feature set) and resolution run when the compiled graph
executes, outside the traced graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from magi2_core.ops._spec import OpSpec, dense
from magi2_core.selection import shadow
from magi2_core.selection.dispatch import dispatcher

__all__ = ["custom_op", "fake_like"]


def _dense_all(out: Any) -> Any:
    return tuple(dense(t) for t in out) if isinstance(out, (tuple, list)) else dense(out)


def fake_like(name: str) -> Callable[[Mapping[str, Any]], torch.Tensor]:
    """The fake of an op whose one output has argument ``name``'s shape, in ``out_dtype`` where the op has
    one and it is set, else in ``name``'s dtype."""

    def fake(a: Mapping[str, Any]) -> torch.Tensor:
        t: torch.Tensor = a[name]
        return t.new_empty(t.shape, dtype=a.get("out_dtype") or t.dtype)

    return fake


def custom_op(spec: OpSpec[Any, Any], returns: Any, fake: Callable[[Mapping[str, Any]], Any]) -> Any:
    """Register ``magi2::<op>`` for ``spec``'s op: its schema from the declared arguments, ``returns`` the
    custom op's Python return type (a tensor or a tuple of them, each made contiguous as :func:`dense`
    says), ``fake`` its output from the arguments by name (what the traced graph sees)."""
    args, validate = spec.args, spec.validator
    signature = args.schema_signature(returns)
    names = list(signature.parameters)

    def body(*given: Any) -> Any:
        values, provider = args.from_schema(given)
        call = args.call(validate, values, compiling=True)
        kernel, name = dispatcher().kernel(spec, call.key, provider)
        return _dense_all(shadow.observed(spec, name, call, spec.run(kernel, call)))

    def fake_body(*given: Any) -> Any:
        return fake(dict(zip(names, given, strict=True)))

    body.__signature__ = signature  # type: ignore[attr-defined]
    body.__name__ = body.__qualname__ = f"_{args.op}_op"
    body.__module__ = f"magi2_core.ops.{args.op}"
    op = torch.library.custom_op(f"magi2::{args.op}", mutates_args=())(body)
    op.register_fake(fake_body)
    return op
