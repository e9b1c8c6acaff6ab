"""The ``moe_route`` operator: head-routed top-k routing of MAGI-2's MoE.

``x [T, Hl, d]``: Hl heads are hidden-state slices, each with its own bank of E experts.
``router_weight`` FP32 ``[Hl·E, d]`` head-major, ``bias`` FP32 ``[Hl·E]`` (selection only); scores
are ``sigmoid`` (the release) or ``softmax`` over a head's experts, computed by
:func:`magi2_core.contracts.moe.router_scores`; the ids are the ``top_k`` largest ``score + bias`` in
descending order, equal values in ascending expert id (NaN ranks highest, ``-inf`` lowest, as
upstream's ``torch.topk``: :func:`magi2_core.testing.specials.route_specials`); the weights are the selected
unbiased scores,
L1-normalised unless ``route_norm=False``, times ``route_scale``. A NaN bias is rejected on the host
(and on a device with device value checks); ``±inf`` are accepted.
The acceptance rule is the routing contract of operators.md §3.2 (ids against the float64 truth).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, Protocol

import torch

from magi2_core.contracts import _checks as checks
from magi2_core.contracts import acceptance as acc
from magi2_core.contracts.moe import ScoreFunc
from magi2_core.errors import InvalidShapeError, InvalidValueError
from magi2_core.model.problem import FEATURE_BIT, Feature
from magi2_core.ops._args import OPTIONAL_TENSOR, TENSOR, VALUE, Arg, Args, record
from magi2_core.ops._compiled import custom_op
from magi2_core.ops._lookup import cache_lookup
from magi2_core.ops._spec import OpSpec, forward_only
from magi2_core.selection import shadow as _shadow

__all__ = ["ARGS", "SPEC", "MoERouteKernel", "RouteCall", "RouteKey", "moe_route", "validate"]

OP: Literal["moe_route"] = "moe_route"
_SOFTMAX, _NO_NORM = FEATURE_BIT[Feature.ROUTE_SOFTMAX], FEATURE_BIT[Feature.ROUTE_NO_NORM]


class RouteKey(NamedTuple):
    """The typed problem of a routing call: what provider selection may depend on."""

    device: torch.device | str
    dtype: str
    out_dtype: None
    features: int
    tokens: int
    num_heads: int
    num_experts: int
    top_k: int
    hidden: int


class RouteCall(NamedTuple):
    """One validated routing call: what a provider receives, whole and frozen (the core API 2 ABI).

    ``score_func="softmax"`` and ``route_norm=False`` reach only providers that declare the
    ``route_softmax`` / ``route_no_norm`` features. The tensors come first: a repeated layout reuses the rest.
    """

    x: torch.Tensor
    router_weight: torch.Tensor
    bias: torch.Tensor | None
    top_k: int
    route_scale: float
    route_norm: bool
    score_func: ScoreFunc
    key: RouteKey


# The arguments of :func:`moe_route` (without ``provider``), declared once: see :mod:`magi2_core.ops._args`.
ARGS = Args(
    OP,
    (
        Arg(
            "x",
            "torch.Tensor",
            "``[T, Hl, d]``, BF16, FP16 or FP32 (the activations; scores are computed in FP32).",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "router_weight",
            "torch.Tensor",
            "``[Hl·E, d]`` FP32, head-major (rows ``h·E .. h·E+E-1`` are head h's "
            "experts), on x's device; its row count must be a multiple of Hl.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "bias",
            "torch.Tensor | None",
            "``[Hl·E]`` FP32, head-major, on x's device, or None. It shifts the "
            "selection only: the weights are computed from the unbiased scores.",
            schema=torch.Tensor | None,
            layout=OPTIONAL_TENSOR,
        ),
        Arg("top_k", "int", "K, an int in ``[1, E]``.", 6, schema=int),
        Arg(
            "route_scale",
            "float",
            "a finite float multiplying the weights (MAGI-2: 4.9).",
            4.9,
            schema=float,
            to_schema=float,
        ),
        Arg(
            "route_norm",
            "bool",
            "L1-normalise each token's K weights (eps 1e-12) before scaling (MAGI-2: True).",
            True,
            schema=bool,
        ),
        Arg(
            "score_func",
            "ScoreFunc",
            '``"sigmoid"`` (MAGI-2\'s release) or ``"softmax"`` over each head\'s experts.',
            "sigmoid",
            schema=str,
            layout=VALUE,
        ),
    ),
)
_TENSORS = 3  # the leading tensor fields of RouteCall; a cache hit reuses the fields after them


class MoERouteKernel(Protocol):
    """What a ``moe_route`` provider's kernel object is called with: one :class:`RouteCall`."""

    def __call__(self, call: RouteCall) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(probs [Hl, T, K] FP32, idx [Hl, T, K] int64)``."""
        ...


def validate(
    x: object,
    router_weight: object,
    bias: object,
    *,
    top_k: int,
    route_scale: float,
    route_norm: bool = True,
    score_func: str = "sigmoid",
    compiling: bool,
) -> RouteCall:
    """Check every argument (raising an input error that names it) and normalise the inputs."""
    op = OP
    x = checks.head_activations(op, "x", x)
    t, hl, d = x.shape
    w = checks.tensor(op, "router_weight", router_weight)
    checks.dtype_in(op, "router_weight", w, (torch.float32,))
    if w.dim() != 2 or w.shape[1] != d or hl == 0 or w.shape[0] % hl != 0 or w.shape[0] == 0:
        raise InvalidShapeError(
            op, "router_weight", f"FP32 [heads·experts, {d}] with a multiple of {hl} rows", checks.describe(w)
        )
    e = w.shape[0] // hl
    b: torch.Tensor | None = None
    if bias is not None:
        b = checks.tensor(op, "bias", bias)
        checks.dtype_in(op, "bias", b, (torch.float32,))
        if tuple(b.shape) != (hl * e,):
            raise InvalidShapeError(op, "bias", f"FP32 [{hl * e}] (one per head·expert)", checks.describe(b))
    checks.same_device(op, "x", x, router_weight=w, bias=b)
    if b is not None:
        checks.nan_free_parameter(op, "bias", b)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise InvalidShapeError(op, "top_k", f"an int in [1, {e}] (experts per head)", repr(top_k))
    scale = checks.real(op, "route_scale", route_scale, "a finite float")
    if not math.isfinite(scale):
        raise InvalidValueError(op, "route_scale", "a finite float", repr(route_scale))
    if not isinstance(route_norm, bool):
        raise InvalidValueError(op, "route_norm", "True or False", repr(route_norm))
    if score_func == "sigmoid":
        func: ScoreFunc = "sigmoid"
    elif score_func == "softmax":
        func = "softmax"
    else:
        raise InvalidValueError(op, "score_func", "'sigmoid' or 'softmax'", repr(score_func))
    call = RouteCall(x, w, b, top_k, scale, route_norm, func, None)  # type: ignore[arg-type]
    mask = ARGS.features(call, compiling) | (_SOFTMAX if func == "softmax" else 0) | (0 if route_norm else _NO_NORM)
    return call._replace(key=RouteKey(x.device, checks.dtype_name(x.dtype), None, mask, t, hl, e, top_k, d))


class _Layout(NamedTuple):
    kernel: Any
    provider: str
    rest: tuple[Any, ...]  # the validated call's fields after its tensors (scalars and the key)
    recheck: bool  # a host bias: checked for NaN on every call (checks.nan_free_parameter says why)


def _make(kernel: Any, name: str, call: RouteCall, args: tuple[Any, ...]) -> _Layout:
    """What a repeated call of this layout reuses (``args``: the declared arguments)."""
    host_bias = call.bias is not None and call.bias.numel() > 0 and call.bias.device.type == "cpu"
    return _Layout(kernel, name, call[_TENSORS:], host_bias)


def _recheck(hit: _Layout, bias: torch.Tensor) -> None:
    checks.nan_free_parameter(OP, "bias", bias)


@ARGS.public
def moe_route(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    top_k: int = 6,
    route_scale: float = 4.9,
    route_norm: bool = True,
    score_func: ScoreFunc = "sigmoid",
    provider: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Head-routed top-k: ``probs [Hl, T, K]`` FP32 and per-head expert ids ``idx [Hl, T, K]``.

    The hidden state is cut into ``Hl`` heads of width ``d``; each head routes every token to
    ``K = top_k`` of its own ``E`` experts. E is not passed: it is ``router_weight.shape[0] / Hl``
    (a router ``[8, 32]`` with ``x [T, 2, 32]`` is 2 heads of 4 experts).

    Returns:
        ``(probs, idx)``: ``probs [Hl, T, K]`` FP32, the weights; ``idx [Hl, T, K]`` int64, the
        expert ids within each head, in ``[0, E)``: the ``top_k`` largest biased scores in
        descending order, equal scores in ascending expert id. Both head-major, as
        :func:`moe_experts` takes them.
    """
    if torch.is_grad_enabled() and (
        getattr(x, "requires_grad", False)
        or getattr(router_weight, "requires_grad", False)
        or getattr(bias, "requires_grad", False)
    ):
        forward_only(OP, x=x, router_weight=router_weight, bias=bias)
    args = (x, router_weight, bias, top_k, route_scale, route_norm, score_func)
    if torch.compiler.is_compiling():
        probs, idx = ARGS.compiled(args, provider)
        return probs, idx
    b = _bind(args, provider)
    # one record per call, built without the NamedTuple's Python __new__ (concatenation: faster than *)
    call: RouteCall = record(RouteCall, (x, router_weight, bias) + b.rest)  # noqa: RUF005
    probs, idx = _shadow.observed(SPEC, b.provider, call, b.kernel(call))
    return probs, idx


def _accept(
    problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: RouteCall
) -> list[acc.Acceptance]:
    # The ids are judged against the float64 truth of the inputs, not the reference's FP32 ids (a
    # near-tie may fall either way); the weights against the reference's FP32 weights of the same ids.
    truth = acc.route_truth(
        call.x,
        call.router_weight,
        call.bias,
        top_k=call.top_k,
        route_scale=call.route_scale,
        route_norm=call.route_norm,
        score_func=call.score_func,
    )
    return [acc.accept_moe_route(got["probs"], got["idx"], truth)]


SPEC: OpSpec[RouteCall, RouteKey] = OpSpec(ARGS, RouteKey, validate, outputs=("probs", "idx"), accept=_accept)
_bind: Callable[..., _Layout] = cache_lookup(SPEC, _make, value_checked=True, recheck=("bias", _recheck))


def _fake(a: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    t, h, k = a["x"].shape[0], a["x"].shape[1], a["top_k"]
    return a["x"].new_empty((h, t, k), dtype=torch.float32), a["x"].new_empty((h, t, k), dtype=torch.int64)


custom_op(SPEC, tuple[torch.Tensor, torch.Tensor], _fake)
