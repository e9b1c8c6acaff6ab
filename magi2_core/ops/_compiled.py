"""An op's ``torch.library`` custom op (``magi2::<op>``), registered from its declared arguments.

Under ``torch.compile`` each public op is recorded as one opaque custom op: the fake gives the output
shapes, and validation (with the ``compiling`` feature set) and resolution run when the compiled graph
executes, outside the traced graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from magi2_core import shadow
from magi2_core.dispatch import dispatcher
from magi2_core.ops._args import Args

__all__ = ["custom_op"]


def custom_op(
    args: Args,
    spec: Any,
    validate: Callable[..., Any],
    returns: Any,
    result: Callable[[Any], Any],
    fake: Callable[[Mapping[str, Any]], Any],
) -> Any:
    """Register ``magi2::<op>`` for the op declared by ``args``.

    ``returns`` is the custom op's Python return type, ``result`` what it makes of the kernel's output,
    ``fake`` its output from the arguments by name (what the traced graph sees).
    """
    signature = args.schema_signature(returns)
    names = list(signature.parameters)

    def body(*given: Any) -> Any:
        values, provider = args.from_schema(given)
        call = args.call(validate, values, compiling=True)
        kernel, name = dispatcher().kernel(spec, call.key, provider)
        return result(shadow.observed(spec, name, call, spec.run(kernel, call)))

    def fake_body(*given: Any) -> Any:
        return fake(dict(zip(names, given, strict=True)))

    body.__signature__ = signature  # type: ignore[attr-defined]
    body.__name__ = body.__qualname__ = f"_{args.op}_op"
    body.__module__ = f"magi2_core.ops.{args.op}"
    op = torch.library.custom_op(f"magi2::{args.op}", mutates_args=())(body)
    op.register_fake(fake_body)
    return op
