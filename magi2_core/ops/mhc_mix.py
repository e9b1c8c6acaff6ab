"""The ``mhc_mix`` operator: the mHC stream update after a branch (operators.md §5.3).

``new[t, i] = cast(cast(Σ_j residual[t, i, j]·streams[t, j]) + cast(post[t, i]·branch_output[t]))``: the
residual mix and the branch term each materialised in the streams' dtype before their sum, as
vllm-omni 0.30.0's native einsums do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple, Protocol

import torch

from magi2_core import shadow as _shadow
from magi2_core.contracts import _checks as ck
from magi2_core.contracts import acceptance as acc
from magi2_core.dispatch import dispatcher
from magi2_core.errors import InvalidDTypeError, InvalidShapeError
from magi2_core.ops._spec import OpSpec, dense, forward_only
from magi2_core.overrides import context_token
from magi2_core.problem import FEATURE_BIT, Feature

__all__ = ["SPEC", "MHCMixCall", "MHCMixKernel", "MHCMixKey", "mhc_mix", "validate"]

OP: Literal["mhc_mix"] = "mhc_mix"
_COMPILING = FEATURE_BIT[Feature.COMPILING]


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


_TENSORS = 4
_record = tuple.__new__


class MHCMixKernel(Protocol):
    """What an ``mhc_mix`` provider's kernel object is called with: one :class:`MHCMixCall`."""

    def __call__(self, call: MHCMixCall) -> torch.Tensor:
        """Return the new ``[T, n, D]`` streams in the streams' dtype."""
        ...


def validate(streams: object, branch_output: object, post: object, residual: object, *, compiling: bool) -> MHCMixCall:
    """Check every argument (raising an input error that names it)."""
    x = ck.tensor(OP, "streams", streams)
    ck.with_data(OP, "streams", x)
    ck.dtype_in(OP, "streams", x, ck.FLOATS)
    if x.dim() != 3 or x.shape[1] < 1 or x.shape[2] < 1:
        raise InvalidShapeError(OP, "streams", "[tokens, n, D] with n >= 1 streams of width D >= 1", ck.describe(x))
    t, n, d = x.shape
    y = ck.tensor(OP, "branch_output", branch_output)
    if y.dtype != x.dtype:
        raise InvalidDTypeError(OP, "branch_output", f"the streams' dtype {ck.dtype_name(x.dtype)}", ck.describe(y))
    if tuple(y.shape) != (t, d):
        raise InvalidShapeError(OP, "branch_output", f"[{t}, {d}] (tokens, stream width)", ck.describe(y))
    p = ck.tensor(OP, "post", post)
    r = ck.tensor(OP, "residual", residual)
    ck.dtype_in(OP, "post", p, ck.FLOATS)
    ck.dtype_in(OP, "residual", r, ck.FLOATS)
    if tuple(p.shape) != (t, n):
        raise InvalidShapeError(OP, "post", f"[{t}, {n}] (tokens, streams)", ck.describe(p))
    if tuple(r.shape) != (t, n, n):
        raise InvalidShapeError(OP, "residual", f"[{t}, {n}, {n}] (tokens, streams, streams)", ck.describe(r))
    ck.same_device(OP, "streams", x, branch_output=y, post=p, residual=r)
    mask = _COMPILING if compiling else 0
    return MHCMixCall(x, y, p, r, MHCMixKey(x.device, ck.dtype_name(x.dtype), None, mask, t, n, d))


class _Bound(NamedTuple):
    kernel: Any
    provider: str
    rest: tuple[Any, ...]


def _bind(tensors: tuple[torch.Tensor, ...], provider: str | None, compiling: bool) -> _Bound:
    """Validate and resolve, or find both done for this call layout."""
    d = dispatcher()
    bound = d.bound_calls()
    try:
        layout = (OP, provider, context_token(), *((t.shape, t.dtype, t.device) for t in tensors), compiling)
        hit: _Bound | None = bound.get(layout)
    except (AttributeError, TypeError, RuntimeError):
        layout, hit = None, None
    if hit is not None:
        return hit
    call = validate(*tensors, compiling=compiling)
    kernel, name = d.kernel(SPEC, call.key, provider)
    hit = _Bound(kernel, name, call[_TENSORS:])
    if layout is not None:
        if len(bound) >= d.BOUND_LIMIT:
            bound.clear()
        bound[layout] = hit
    return hit


def mhc_mix(
    streams: torch.Tensor,
    branch_output: torch.Tensor,
    post: torch.Tensor,
    residual: torch.Tensor,
    *,
    provider: str | None = None,
) -> torch.Tensor:
    """The mHC stream update: ``cast(residual @ streams) + cast(post ⊗ branch_output)``, cast once more.

    Args:
        streams: ``[T, n, D]`` BF16, FP16 or FP32.
        branch_output: ``[T, D]`` in the streams' dtype (the branch's output).
        post: ``[T, n]``, residual: ``[T, n, n]`` (as :func:`mhc_pre` returns them; any float dtype).
        provider: force a provider by name (see ``m2.use`` for a scope).

    Returns:
        The new ``[T, n, D]`` streams in the streams' dtype (products and sums in FP32).
    """
    tensors = (streams, branch_output, post, residual)
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        forward_only(OP, streams=streams, branch_output=branch_output, post=post, residual=residual)
    if torch.compiler.is_compiling():
        y: torch.Tensor = torch.ops.magi2.mhc_mix(*tensors, provider)
        return y
    b = _bind(tensors, provider, False)
    call: MHCMixCall = _record(MHCMixCall, tensors + b.rest)
    out: torch.Tensor = b.kernel(call)
    scope = _shadow.sampling()
    if scope is not None:
        _shadow.observe(scope, SPEC, b.provider, call, out)
    return out


@torch.library.custom_op("magi2::mhc_mix", mutates_args=())
def _mhc_mix_op(
    streams: torch.Tensor, branch_output: torch.Tensor, post: torch.Tensor, residual: torch.Tensor, provider: str | None
) -> torch.Tensor:
    call = validate(streams, branch_output, post, residual, compiling=True)
    kernel, name = dispatcher().kernel(SPEC, call.key, provider)
    out: torch.Tensor = SPEC.run(kernel, call)
    scope = _shadow.sampling()
    if scope is not None:
        _shadow.observe(scope, SPEC, name, call, out)
    return dense(out)


@_mhc_mix_op.register_fake
def _(
    streams: torch.Tensor, branch_output: torch.Tensor, post: torch.Tensor, residual: torch.Tensor, provider: str | None
) -> torch.Tensor:
    return streams.new_empty(streams.shape)


class MHCMixSpec(OpSpec[MHCMixCall, MHCMixKey]):
    name = OP
    family = "mhc"
    key_type = MHCMixKey
    arg_names = ("streams", "branch_output", "post", "residual")
    kernel_protocol = MHCMixKernel

    def validate_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> MHCMixCall:
        return validate(*args, compiling=False, **kwargs)

    def outputs(self, out: Any) -> dict[str, torch.Tensor]:
        return {"streams": out}

    def accept(
        self, problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: Any
    ) -> list[acc.Acceptance]:
        return [acc.accept_mhc_mix(got["streams"], ref["streams"], call)]


SPEC = MHCMixSpec()
