"""The ``mhc_mix`` operator: the mHC stream update after a branch (operators.md §5.3).

``new[t, i] = cast(cast(Σ_j residual[t, i, j]·streams[t, j]) + cast(post[t, i]·branch_output[t]))``: the
residual mix and the branch term each materialised in the streams' dtype before their sum, as
vllm-omni 0.30.0's native einsums do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, Protocol

import torch

from magi2_core.contracts import _checks as checks
from magi2_core.contracts import acceptance as acc
from magi2_core.errors import InvalidDTypeError, InvalidShapeError
from magi2_core.ops._args import TENSOR, Arg, Args, record
from magi2_core.ops._compiled import custom_op, fake_like
from magi2_core.ops._lookup import Layout, cache_lookup, keep_scalars
from magi2_core.ops._spec import OpSpec, forward_only
from magi2_core.selection import shadow as _shadow

__all__ = ["ARGS", "SPEC", "MHCMixCall", "MHCMixKernel", "MHCMixKey", "mhc_mix", "validate"]

OP: Literal["mhc_mix"] = "mhc_mix"


class MHCMixKey(NamedTuple):
    """The typed problem of an ``mhc_mix`` call."""

    device: torch.device | str
    dtype: str
    out_dtype: None
    features: int
    tokens: int
    num_streams: int
    hidden: int


class MHCMixCall(NamedTuple):
    """One validated ``mhc_mix`` call: ``streams [T, n, D]``, ``branch_output [T, D]`` (the streams'
    dtype), ``post [T, n]`` and ``residual [T, n, n]`` (any float dtype)."""

    streams: torch.Tensor
    branch_output: torch.Tensor
    post: torch.Tensor
    residual: torch.Tensor
    key: MHCMixKey


# The arguments of :func:`mhc_mix` (without ``provider``), declared once: see :mod:`magi2_core.ops._args`.
ARGS = Args(
    OP,
    (
        Arg("streams", "torch.Tensor", "``[T, n, D]`` BF16, FP16 or FP32.", schema=torch.Tensor, layout=TENSOR),
        Arg(
            "branch_output",
            "torch.Tensor",
            "``[T, D]`` in the streams' dtype (the branch's output).",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "post",
            "torch.Tensor",
            "``[T, n]`` (as :func:`mhc_pre` returns it; any float dtype).",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "residual",
            "torch.Tensor",
            "``[T, n, n]`` (as :func:`mhc_pre` returns it; any float dtype).",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
    ),
)
_TENSORS = 4  # the leading tensor fields of MHCMixCall; a cache hit reuses the fields after them


class MHCMixKernel(Protocol):
    """What an ``mhc_mix`` provider's kernel object is called with: one :class:`MHCMixCall`."""

    def __call__(self, call: MHCMixCall) -> torch.Tensor:
        """Return the new ``[T, n, D]`` streams in the streams' dtype."""
        ...


def validate(streams: object, branch_output: object, post: object, residual: object, *, compiling: bool) -> MHCMixCall:
    """Check every argument (raising an input error that names it)."""
    x = checks.float_input(OP, "streams", streams)
    t, n, d = checks.rows_3d(OP, "streams", x, "[tokens, n, D] with n >= 1 streams of width D >= 1")
    y = checks.tensor(OP, "branch_output", branch_output)
    if y.dtype != x.dtype:
        raise InvalidDTypeError(
            OP, "branch_output", f"the streams' dtype {checks.dtype_name(x.dtype)}", checks.describe(y)
        )
    if tuple(y.shape) != (t, d):
        raise InvalidShapeError(OP, "branch_output", f"[{t}, {d}] (tokens, stream width)", checks.describe(y))
    p = checks.tensor(OP, "post", post)
    r = checks.tensor(OP, "residual", residual)
    checks.dtype_in(OP, "post", p, checks.FLOATS)
    checks.dtype_in(OP, "residual", r, checks.FLOATS)
    if tuple(p.shape) != (t, n):
        raise InvalidShapeError(OP, "post", f"[{t}, {n}] (tokens, streams)", checks.describe(p))
    if tuple(r.shape) != (t, n, n):
        raise InvalidShapeError(OP, "residual", f"[{t}, {n}, {n}] (tokens, streams, streams)", checks.describe(r))
    checks.same_device(OP, "streams", x, branch_output=y, post=p, residual=r)
    call = MHCMixCall(x, y, p, r, None)  # type: ignore[arg-type]
    return call._replace(
        key=MHCMixKey(x.device, checks.dtype_name(x.dtype), None, ARGS.features(call, compiling), t, n, d)
    )


@ARGS.public
def mhc_mix(
    streams: torch.Tensor,
    branch_output: torch.Tensor,
    post: torch.Tensor,
    residual: torch.Tensor,
    *,
    provider: str | None = None,
) -> torch.Tensor:
    """The mHC stream update: ``cast(residual @ streams) + cast(post ⊗ branch_output)``, cast once more.

    Returns:
        The new ``[T, n, D]`` streams in the streams' dtype (products and sums in FP32).
    """
    if torch.is_grad_enabled() and (
        getattr(streams, "requires_grad", False)
        or getattr(branch_output, "requires_grad", False)
        or getattr(post, "requires_grad", False)
        or getattr(residual, "requires_grad", False)
    ):
        forward_only(OP, streams=streams, branch_output=branch_output, post=post, residual=residual)
    args = (streams, branch_output, post, residual)
    if torch.compiler.is_compiling():
        y: torch.Tensor = ARGS.compiled(args, provider)
        return y
    b = _bind(args, provider)
    call: MHCMixCall = record(MHCMixCall, args + b.rest)
    out: torch.Tensor = b.kernel(call)
    return _shadow.observed(SPEC, b.provider, call, out)


def _accept(
    problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: MHCMixCall
) -> list[acc.Acceptance]:
    return [acc.accept_mhc_mix(got["streams"], ref["streams"], call)]


SPEC: OpSpec[MHCMixCall, MHCMixKey] = OpSpec(ARGS, MHCMixKey, validate, outputs=("streams",), accept=_accept)
_bind: Callable[..., Layout] = cache_lookup(SPEC, keep_scalars(_TENSORS))
custom_op(SPEC, torch.Tensor, fake_like("streams"))
