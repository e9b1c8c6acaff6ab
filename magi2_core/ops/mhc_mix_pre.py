"""The ``mhc_mix_pre`` operator: one branch's stream update, then the next branch's mHC input (operators.md §5.4).

``mhc_mix`` of the streams with the branch that just ran, then ``mhc_pre`` of the new streams with the
next branch's parameters, as one operator: vllm-omni 0.30.0's layer runs exactly this pair between its
attention and MLP branches. Fused, the new streams are read once less: a provider may form the next
branch's logits (the norm's sum of squares and the projection) while it writes them. Its result is the
two ops' results: what ``mhc_mix`` returns, then what ``mhc_pre`` returns of it, with their rounding
points. Its arguments are ``mhc_mix``'s, then ``mhc_pre``'s parameters and options, checked as the two ops
check them (an error in the mix's arguments names ``mhc_mix``, one in the parameters ``mhc_mix_pre``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import torch

from magi2_core import shadow as _shadow
from magi2_core.contracts import _checks as checks
from magi2_core.contracts import acceptance as acc
from magi2_core.ops._args import Args, record
from magi2_core.ops._compiled import custom_op
from magi2_core.ops._lookup import Layout, cache_lookup, keep_scalars
from magi2_core.ops._spec import OpSpec, forward_only
from magi2_core.ops.mhc_mix import ARGS as MIX_ARGS
from magi2_core.ops.mhc_mix import MHCMixCall
from magi2_core.ops.mhc_mix import validate as validate_mix
from magi2_core.ops.mhc_pre import ARGS as PRE_ARGS
from magi2_core.ops.mhc_pre import (
    DEFAULT_EPS,
    DEFAULT_SINKHORN_EPS,
    DEFAULT_SINKHORN_ITERATIONS,
    MHCPreCall,
    checked_parameters,
    mhc_pre,
)

__all__ = ["ARGS", "SPEC", "MHCMixPreCall", "MHCMixPreKernel", "MHCMixPreKey", "mhc_mix_pre", "validate"]

OP: Literal["mhc_mix_pre"] = "mhc_mix_pre"


class MHCMixPreKey(NamedTuple):
    """The typed problem of an ``mhc_mix_pre`` call (``out_dtype``: the new post / residual's dtype)."""

    device: torch.device | str
    dtype: str
    out_dtype: str
    features: int
    tokens: int
    num_streams: int
    hidden: int
    num_modalities: int


class MHCMixPreCall(NamedTuple):
    """One validated ``mhc_mix_pre`` call: the fields of an ``mhc_mix`` call (``streams`` to
    ``residual``), then those of an ``mhc_pre`` call after its streams (``norm_weight`` to ``out_dtype``:
    the next branch's parameters; see :class:`~magi2_core.ops.mhcMHCPreCall`)."""

    streams: torch.Tensor
    branch_output: torch.Tensor
    post: torch.Tensor
    residual: torch.Tensor
    norm_weight: torch.Tensor
    phi: torch.Tensor
    alpha_pre: torch.Tensor
    alpha_post: torch.Tensor
    alpha_res: torch.Tensor
    bias_pre: torch.Tensor
    bias_post: torch.Tensor
    bias_res: torch.Tensor
    eps: float
    modality_sizes: tuple[int, ...] | None
    sinkhorn_iterations: int
    sinkhorn_eps: float
    out_dtype: torch.dtype
    key: MHCMixPreKey

    def mix_call(self) -> MHCMixCall:
        """The ``mhc_mix`` part of this call."""
        return MHCMixCall(*self[:4], None)  # type: ignore[arg-type]

    def pre_call(self, streams: torch.Tensor) -> MHCPreCall:
        """The ``mhc_pre`` part of this call, on ``streams`` (the new streams)."""
        return MHCPreCall(streams, *self[4:-1], None)  # type: ignore[arg-type]


# The arguments of :func:`mhc_mix_pre` (without ``provider``): mhc_mix's, then mhc_pre's after its streams.
ARGS = Args(OP, MIX_ARGS.rows + PRE_ARGS.rows[1:])
_TENSORS = 12  # the leading tensor fields of MHCMixPreCall; a cache hit reuses the fields after them


class MHCMixPreKernel(Protocol):
    """What an ``mhc_mix_pre`` provider's kernel object is called with: one :class:`MHCMixPreCall`."""

    def __call__(self, call: MHCMixPreCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return ``(streams [T, n, D], branch_input [T, D], post [T, n], residual [T, n, n])``: the new
        streams and the branch input in the streams' dtype, the coefficients in ``call.out_dtype``."""
        ...


def validate(
    streams: object,
    branch_output: object,
    post: object,
    residual: object,
    norm_weight: object,
    phi: object,
    alpha_pre: object,
    alpha_post: object,
    alpha_res: object,
    bias_pre: object,
    bias_post: object,
    bias_res: object,
    *,
    eps: float,
    modality_sizes: object,
    sinkhorn_iterations: int,
    sinkhorn_eps: float,
    out_dtype: torch.dtype | None,
    compiling: bool,
) -> MHCMixPreCall:
    """Check every argument as ``mhc_mix`` and ``mhc_pre`` do (raising an input error that names it)."""
    mix = validate_mix(streams, branch_output, post, residual, compiling=compiling)
    rest = checked_parameters(
        OP,
        mix.streams,
        norm_weight,
        phi,
        alpha_pre,
        alpha_post,
        alpha_res,
        bias_pre,
        bias_post,
        bias_res,
        eps=eps,
        modality_sizes=modality_sizes,
        sinkhorn_iterations=sinkhorn_iterations,
        sinkhorn_eps=sinkhorn_eps,
        out_dtype=out_dtype,
    )
    call = MHCMixPreCall._make((*mix[:4], *rest, None))  # the key follows, from the checked call
    x, od, sizes = call.streams, call.out_dtype, call.modality_sizes
    t, n, d = x.shape
    m = 1 if sizes is None else len(sizes)
    mask = ARGS.features(call, compiling)
    key = MHCMixPreKey(x.device, checks.dtype_name(x.dtype), checks.dtype_name(od), mask, t, n, d, m)
    return call._replace(key=key)


@ARGS.public
def mhc_mix_pre(
    streams: torch.Tensor,
    branch_output: torch.Tensor,
    post: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    phi: torch.Tensor,
    alpha_pre: torch.Tensor,
    alpha_post: torch.Tensor,
    alpha_res: torch.Tensor,
    bias_pre: torch.Tensor,
    bias_post: torch.Tensor,
    bias_res: torch.Tensor,
    *,
    eps: float = DEFAULT_EPS,
    modality_sizes: Sequence[int] | None = None,
    sinkhorn_iterations: int = DEFAULT_SINKHORN_ITERATIONS,
    sinkhorn_eps: float = DEFAULT_SINKHORN_EPS,
    out_dtype: torch.dtype | None = None,
    provider: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``new = mhc_mix(streams, branch_output, post, residual)``, then ``mhc_pre(new, norm_weight, ...)``.

    ``post`` and ``residual`` are the coefficients of the branch that produced ``branch_output``;
    ``norm_weight`` to ``bias_res`` and the options are the next branch's (operators.md §5.4).

    Returns:
        ``(new streams [T, n, D], branch_input [T, D], post [T, n], residual [T, n, n])``: ``mhc_mix``'s
        result, then ``mhc_pre``'s of it.
    """
    tensors = (
        streams,
        branch_output,
        post,
        residual,
        norm_weight,
        phi,
        alpha_pre,
        alpha_post,
        alpha_res,
        bias_pre,
        bias_post,
        bias_res,
    )
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        forward_only(OP, **dict(zip(ARGS.names[:_TENSORS], tensors, strict=True)))
    args = (*tensors, eps, modality_sizes, sinkhorn_iterations, sinkhorn_eps, out_dtype)
    if torch.compiler.is_compiling():
        out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] = ARGS.compiled(args, provider)
        return out
    b = _bind(args, provider)
    call: MHCMixPreCall = record(MHCMixPreCall, tensors + b.rest)
    out = b.kernel(call)
    return _shadow.observed(SPEC, b.provider, call, out)


def _accept(
    problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: MHCMixPreCall
) -> list[acc.Acceptance]:
    """``mhc_mix``'s rule on the new streams; ``mhc_pre``'s rules on the rest, against the reference's
    ``mhc_pre`` of the provider's own new streams (so that a new stream one rounding off, which the mix's
    rule allows, is not counted again in the branch input and the coefficients)."""
    new = got["streams"].cpu()
    pre = call.pre_call(new)
    want = mhc_pre(
        new,
        *(t.cpu() for t in pre[1:9]),
        eps=pre.eps,
        modality_sizes=pre.modality_sizes,
        sinkhorn_iterations=pre.sinkhorn_iterations,
        sinkhorn_eps=pre.sinkhorn_eps,
        out_dtype=pre.out_dtype,
        provider="reference",
    )
    return [
        acc.accept_mhc_mix(new, ref["streams"], call.mix_call()),
        acc.accept_mhc_branch_input(got["branch_input"], want[0], new),
        acc.accept_mhc_coefficients(got["post"], want[1], "post"),
        acc.accept_mhc_coefficients(got["residual"], want[2], "residual"),
    ]


SPEC: OpSpec[MHCMixPreCall, MHCMixPreKey] = OpSpec(
    ARGS, MHCMixPreKey, validate, outputs=("streams", "branch_input", "post", "residual"), accept=_accept
)
_bind: Callable[..., Layout] = cache_lookup(SPEC, keep_scalars(_TENSORS))


def _fake(a: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    x = a["streams"]
    t, n, d = x.shape
    od = a["out_dtype"] or x.dtype
    new_streams, branch_input = x.new_empty((t, n, d)), x.new_empty((t, d))
    return new_streams, branch_input, x.new_empty((t, n), dtype=od), x.new_empty((t, n, n), dtype=od)


custom_op(SPEC, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], _fake)
