"""The ``output_gate`` operator: attention's output rows gathered, gated per head by ``sigmoid``, cast once.

MAGI-2's attention output (vllm-omni 0.30.0's ``Magi2Attention.output``) moves the attention result's
rows into modality order (``permute``), multiplies each head by the sigmoid of its gate logit (the
logits come from the gate projection, rows in modality order) and casts to the checkpoint dtype before
the output projection:

``y[t, h, :] = x[src, h, :]·sigmoid(gate[t, h])`` in FP32, ``src = index[t]`` (or ``t``), one cast.

Upstream's eager form rounds ``sigmoid(gate)`` to the gate's dtype before the product (two roundings);
under ``torch.compile`` inductor computes it in FP32 and rounds once, as this op does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, Protocol

import torch

from magi2_core.contracts import _checks as checks
from magi2_core.contracts import acceptance as acc
from magi2_core.errors import InvalidShapeError
from magi2_core.ops._args import TENSOR, Arg, Args, index_arg, out_dtype_arg, record
from magi2_core.ops._compiled import custom_op, fake_like
from magi2_core.ops._lookup import Layout, cache_lookup, keep_scalars
from magi2_core.ops._spec import OpSpec, forward_only
from magi2_core.selection import shadow as _shadow

__all__ = ["ARGS", "SPEC", "OutputGateCall", "OutputGateKernel", "OutputGateKey", "output_gate"]

OP: Literal["output_gate"] = "output_gate"


class OutputGateKey(NamedTuple):
    """The typed problem of an ``output_gate`` call."""

    device: torch.device | str
    dtype: str
    out_dtype: str
    features: int
    tokens: int
    num_heads: int
    head_dim: int


class OutputGateCall(NamedTuple):
    """One validated ``output_gate`` call: ``x [T, H, D]`` (any strides), ``gate [T, H]`` or ``[T, H, 1]``
    (any strides; element ``(t, h)`` at ``gate.stride(0)·t + gate.stride(1)·h``), ``index [T]`` or
    ``None``, ``out_dtype`` resolved."""

    x: torch.Tensor
    gate: torch.Tensor
    index: torch.Tensor | None  # type: ignore[assignment]  # the argument's name; shadows tuple.index (unused)
    out_dtype: torch.dtype
    key: OutputGateKey


# The arguments of :func:`output_gate` (without ``provider``), declared once: see :mod:`magi2_core.ops._args`.
ARGS = Args(
    OP,
    (
        Arg(
            "x",
            "torch.Tensor",
            "``[T, H, D]`` attention output, BF16, FP16 or FP32, any strides; rows in sequence order.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "gate",
            "torch.Tensor",
            "``[T, H]`` or ``[T, H, 1]`` gate logits, any float dtype and strides, rows in output order.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        index_arg("permute"),
        out_dtype_arg(),
    ),
)
_TENSORS = 3  # the leading tensor fields of OutputGateCall; a cache hit reuses the fields after them


class OutputGateKernel(Protocol):
    """What an ``output_gate`` provider's kernel object is called with: one :class:`OutputGateCall`."""

    def __call__(self, call: OutputGateCall) -> torch.Tensor:
        """Return a new contiguous ``[T, H, D]`` tensor in ``call.out_dtype``."""
        ...


def validate(
    x: object, gate: object, *, index: object, out_dtype: torch.dtype | None, compiling: bool
) -> OutputGateCall:
    """Check every argument (raising an input error that names it) and normalise the inputs."""
    x = checks.float_input(OP, "x", x)
    t, h, d = checks.rows_3d(OP, "x", x, "[tokens, heads H >= 1, head dim D >= 1]")
    g = checks.tensor(OP, "gate", gate)
    checks.dtype_in(OP, "gate", g, checks.FLOATS)
    if tuple(g.shape) not in ((t, h), (t, h, 1)):
        raise InvalidShapeError(
            OP, "gate", f"[{t}, {h}] or [{t}, {h}, 1]: one logit per row and head", checks.describe(g)
        )
    idx = checks.gather_index(OP, index, t)
    checks.same_device(OP, "x", x, gate=g, index=idx)
    od = checks.out_dtype(OP, out_dtype, x.dtype)
    call = OutputGateCall(x, g, idx, od, None)  # type: ignore[arg-type]
    mask = ARGS.features(call, compiling)
    return call._replace(key=OutputGateKey(x.device, checks.dtype_name(x.dtype), checks.dtype_name(od), mask, t, h, d))


@ARGS.public
def output_gate(
    x: torch.Tensor,
    gate: torch.Tensor,
    *,
    index: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    provider: str | None = None,
) -> torch.Tensor:
    """Attention's output rows gathered by ``index``, each head scaled by ``sigmoid(gate)``, in FP32, cast once.

    Returns:
        ``y``, a new contiguous ``[T, H, D]`` tensor in ``out_dtype``, rows in output (gate) order.
    """
    if torch.is_grad_enabled() and (getattr(x, "requires_grad", False) or getattr(gate, "requires_grad", False)):
        forward_only(OP, x=x, gate=gate)
    args = (x, gate, index, out_dtype)
    if torch.compiler.is_compiling():
        y: torch.Tensor = ARGS.compiled(args, provider)
        return y
    b = _bind(args, provider)
    call: OutputGateCall = record(OutputGateCall, (x, gate, index) + b.rest)  # noqa: RUF005
    out: torch.Tensor = b.kernel(call)
    return _shadow.observed(SPEC, b.provider, call, out)


def _accept(
    problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: OutputGateCall
) -> list[acc.Acceptance]:
    return [acc.accept_output_gate(got["y"], ref["y"], call.gate)]


SPEC: OpSpec[OutputGateCall, OutputGateKey] = OpSpec(ARGS, OutputGateKey, validate, outputs=("y",), accept=_accept)
_bind: Callable[..., Layout] = cache_lookup(SPEC, keep_scalars(_TENSORS))
custom_op(SPEC, torch.Tensor, fake_like("x"))
