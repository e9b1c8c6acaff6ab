"""The ``mhc_pre`` operator: an mHC branch's input and its post / residual coefficients (operators.md §5).

From the ``[T, n, D]`` hyper-connection streams: the FP32 multi-modality RMSNorm of each token's
flattened ``n·D`` row (``(w[m] + 1)`` scales), its FP32 projection to ``2n + n²`` logits, the sigmoid
pre coefficients and the weighted stream sum (the branch input), the post coefficients and the
Sinkhorn-normalised residual matrix. Rounding points are vllm-omni 0.30.0's native ones: the pre
coefficients and the branch input in the streams' dtype, post and residual once in ``out_dtype``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import torch

from magi2_core import shadow as _shadow
from magi2_core.contracts import _checks as ck
from magi2_core.contracts import acceptance as acc
from magi2_core.dispatch import dispatcher
from magi2_core.errors import InvalidDTypeError, InvalidShapeError, InvalidValueError
from magi2_core.ops._spec import OpSpec, dense, forward_only
from magi2_core.overrides import context_token
from magi2_core.problem import FEATURE_BIT, Feature

__all__ = [
    "DEFAULT_EPS",
    "DEFAULT_SINKHORN_EPS",
    "DEFAULT_SINKHORN_ITERATIONS",
    "SPEC",
    "MHCPreCall",
    "MHCPreKernel",
    "MHCPreKey",
    "mhc_pre",
    "validate",
]

OP: Literal["mhc_pre"] = "mhc_pre"
DEFAULT_EPS = 1e-6
DEFAULT_SINKHORN_ITERATIONS = 20
DEFAULT_SINKHORN_EPS = 1e-12
_COMPILING = FEATURE_BIT[Feature.COMPILING]
_PARAMS = ("norm_weight", "phi", "alpha_pre", "alpha_post", "alpha_res", "bias_pre", "bias_post", "bias_res")


class MHCPreKey(NamedTuple):
    """The typed problem of an ``mhc_pre`` call (``out_dtype``: the post / residual coefficients' dtype)."""

    device: torch.device | str
    dtype: str
    out_dtype: str
    features: int
    tokens: int
    num_streams: int
    hidden: int
    num_modalities: int


class MHCPreCall(NamedTuple):
    """One validated ``mhc_pre`` call: what a provider receives, whole and frozen.

    ``streams`` is ``[T, n, D]``; ``norm_weight`` ``[M, n·D]`` FP32 (a flat parameter viewed so); ``phi``
    ``[n·D, 2n + n²]`` FP32 (columns: pre, post, residual row-major); the alphas are one-element FP32
    tensors, ``bias_pre`` and ``bias_post`` ``[n]``, ``bias_res`` ``[n, n]``, all FP32.
    """

    streams: torch.Tensor
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
    key: MHCPreKey


_TENSORS = 9  # the leading tensor fields of MHCPreCall; a cache hit reuses the fields after them
_record = tuple.__new__


class MHCPreKernel(Protocol):
    """What an ``mhc_pre`` provider's kernel object is called with: one :class:`MHCPreCall`."""

    def __call__(self, call: MHCPreCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return ``(branch_input [T, D] in the streams' dtype, post [T, n], residual [T, n, n])``, the
        coefficients in ``call.out_dtype``."""
        ...


def _fp32_param(name: str, value: object, shape: tuple[int, ...] | None, layout: str) -> torch.Tensor:
    t = ck.tensor(OP, name, value)
    if t.dtype != torch.float32:
        raise InvalidDTypeError(
            OP, name, "a float32 tensor (the mHC parameters are FP32, as in the checkpoint)", ck.describe(t)
        )
    if shape is not None and tuple(t.shape) != shape:
        raise InvalidShapeError(OP, name, layout, ck.describe(t))
    return t


def _non_negative(name: str, value: object) -> float:
    v = ck.real(OP, name, value, "a finite float >= 0")
    if not math.isfinite(v) or v < 0:
        raise InvalidValueError(OP, name, "a finite float >= 0", repr(value))
    return v


def validate(
    streams: object,
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
) -> MHCPreCall:
    """Check every argument (raising an input error that names it) and normalise the inputs."""
    x = ck.tensor(OP, "streams", streams)
    ck.with_data(OP, "streams", x)
    ck.dtype_in(OP, "streams", x, ck.FLOATS)
    if x.dim() != 3 or x.shape[1] < 1 or x.shape[2] < 1:
        raise InvalidShapeError(OP, "streams", "[tokens, n, D] with n >= 1 streams of width D >= 1", ck.describe(x))
    t, n, d = x.shape
    sizes = ck.modality_sizes(OP, modality_sizes, t, "streams.shape[0]")
    m = 1 if sizes is None else len(sizes)
    w = _fp32_param("norm_weight", norm_weight, None, "")
    if tuple(w.shape) not in ((m * n * d,), (m, n * d)):
        raise InvalidShapeError(
            OP,
            "norm_weight",
            f"[{m}·{n * d}] (flat, modality-major) or [{m}, {n * d}]: {m} modalities of the flattened stream width n·D",
            ck.describe(w),
        )
    w = w.view(m, n * d)
    nl = 2 * n + n * n
    p = _fp32_param("phi", phi, (n * d, nl), f"[{n * d}, {nl}]: n·D rows, 2n + n² columns (pre, post, residual)")
    a_pre, a_post, a_res = (
        _fp32_param(name, v, None, "")
        for name, v in (("alpha_pre", alpha_pre), ("alpha_post", alpha_post), ("alpha_res", alpha_res))
    )
    for name, a in (("alpha_pre", a_pre), ("alpha_post", a_post), ("alpha_res", a_res)):
        if a.numel() != 1:
            raise InvalidShapeError(OP, name, "a one-element tensor (a scalar, or shape [1])", ck.describe(a))
    b_pre = _fp32_param("bias_pre", bias_pre, (n,), f"[{n}]")
    b_post = _fp32_param("bias_post", bias_post, (n,), f"[{n}]")
    b_res = _fp32_param("bias_res", bias_res, (n, n), f"[{n}, {n}]")
    params = (w, p, a_pre, a_post, a_res, b_pre, b_post, b_res)
    ck.same_device(OP, "streams", x, **dict(zip(_PARAMS, params, strict=True)))
    e = _non_negative("eps", eps)
    se = _non_negative("sinkhorn_eps", sinkhorn_eps)
    if isinstance(sinkhorn_iterations, bool) or not isinstance(sinkhorn_iterations, int) or sinkhorn_iterations < 0:
        raise InvalidValueError(OP, "sinkhorn_iterations", "an int >= 0", repr(sinkhorn_iterations))
    od = x.dtype if out_dtype is None else out_dtype
    if od not in ck.FLOATS:
        raise InvalidDTypeError(
            OP, "out_dtype", "None, torch.float32, torch.bfloat16 or torch.float16", repr(out_dtype)
        )
    mask = _COMPILING if compiling else 0
    key = MHCPreKey(x.device, ck.dtype_name(x.dtype), ck.dtype_name(od), mask, t, n, d, m)
    return MHCPreCall(x, w, p, a_pre, a_post, a_res, b_pre, b_post, b_res, e, sizes, sinkhorn_iterations, se, od, key)


class _Bound(NamedTuple):
    kernel: Any
    provider: str
    rest: tuple[Any, ...]  # the validated call's fields after its tensors


def _layout(tensors: Sequence[torch.Tensor]) -> tuple[Any, ...]:
    return tuple((t.shape, t.dtype, t.device) for t in tensors)


def _bind(
    tensors: tuple[torch.Tensor, ...],
    eps: float,
    modality_sizes: Sequence[int] | None,
    sinkhorn_iterations: int,
    sinkhorn_eps: float,
    out_dtype: torch.dtype | None,
    provider: str | None,
    compiling: bool,
) -> _Bound:
    """Validate and resolve, or find both done for this call layout."""
    d = dispatcher()
    bound = d.bound_calls()
    scalars = (eps, sinkhorn_iterations, sinkhorn_eps)
    try:
        layout = (
            OP, provider, context_token(), _layout(tensors), *scalars, *map(type, scalars),
            None if modality_sizes is None else (type(modality_sizes), *modality_sizes), out_dtype, compiling,
        )  # fmt: skip
        hit: _Bound | None = bound.get(layout)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, or unhashable: validation says what
        layout, hit = None, None
    if hit is not None:
        return hit
    call = validate(
        *tensors,
        eps=eps,
        modality_sizes=modality_sizes,
        sinkhorn_iterations=sinkhorn_iterations,
        sinkhorn_eps=sinkhorn_eps,
        out_dtype=out_dtype,
        compiling=compiling,
    )
    kernel, name = d.kernel(SPEC, call.key, provider)
    hit = _Bound(kernel, name, call[_TENSORS:])
    plain = modality_sizes is None or all(type(s) is int for s in modality_sizes)
    if layout is not None and plain and not ck.any_tensor(*scalars):
        if len(bound) >= d.BOUND_LIMIT:
            bound.clear()
        bound[layout] = hit
    return hit


def mhc_pre(
    streams: torch.Tensor,
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One mHC branch's input and coefficients from the streams (operators.md §5.2).

    With ``s = 1/sqrt(n·D)`` and ``L = rmsnorm_fp32(streams.view(T, n·D), norm_weight) @ phi`` (FP32)
    split into ``L_pre [T, n]``, ``L_post [T, n]``, ``L_res [T, n, n]``:
    ``c = cast(sigmoid(alpha_pre·s·L_pre + bias_pre), streams.dtype)``, the branch input
    ``Σ_i c[:, i]·streams[:, i]`` (FP32 sum, cast once), ``post = 2·sigmoid(alpha_post·s·L_post + bias_post)``
    and ``residual = sinkhorn(alpha_res·s·L_res + bias_res)``, each cast once to ``out_dtype``.

    Args:
        streams: ``[T, n, D]`` hyper-connection streams, BF16, FP16 or FP32, tokens sorted by modality.
        norm_weight: the mHC norm's delta-scale (the scale is ``w + 1``), FP32, flat ``[M·n·D]`` or
            ``[M, n·D]``, modality-major.
        phi: ``[n·D, 2n + n²]`` FP32 projection (pre, post, residual columns).
        alpha_pre, alpha_post, alpha_res: one-element FP32 tensors.
        bias_pre, bias_post: ``[n]`` FP32; bias_res: ``[n, n]`` FP32.
        eps: the norm's eps, a finite float >= 0.
        modality_sizes: host-side ints, the M contiguous token groups' sizes (None: M = 1).
        sinkhorn_iterations: Sinkhorn-Knopp iterations (>= 0); sinkhorn_eps: the eps of its divisions.
        out_dtype: the post and residual coefficients' dtype (None: the streams' dtype, as upstream).
        provider: force a provider by name (see ``m2.use`` for a scope).

    Returns:
        ``(branch_input [T, D] in the streams' dtype, post [T, n], residual [T, n, n])``.
    """
    tensors = (streams, norm_weight, phi, alpha_pre, alpha_post, alpha_res, bias_pre, bias_post, bias_res)
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors):
        forward_only(OP, **dict(zip(("streams", *_PARAMS), tensors, strict=True)))
    if torch.compiler.is_compiling():
        sizes = None if modality_sizes is None else list(modality_sizes)
        out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = torch.ops.magi2.mhc_pre(
            *tensors, float(eps), sizes, int(sinkhorn_iterations), float(sinkhorn_eps), out_dtype, provider
        )
        return out
    b = _bind(tensors, eps, modality_sizes, sinkhorn_iterations, sinkhorn_eps, out_dtype, provider, False)
    w = norm_weight if norm_weight.dim() == 2 else norm_weight.view(b.rest[-1].num_modalities, -1)
    call: MHCPreCall = _record(MHCPreCall, (streams, w, *tensors[2:]) + b.rest)  # noqa: RUF005
    out = b.kernel(call)
    scope = _shadow.sampling()
    if scope is not None:
        _shadow.observe(scope, SPEC, b.provider, call, out)
    return out


@torch.library.custom_op("magi2::mhc_pre", mutates_args=())
def _mhc_pre_op(
    streams: torch.Tensor,
    norm_weight: torch.Tensor,
    phi: torch.Tensor,
    alpha_pre: torch.Tensor,
    alpha_post: torch.Tensor,
    alpha_res: torch.Tensor,
    bias_pre: torch.Tensor,
    bias_post: torch.Tensor,
    bias_res: torch.Tensor,
    eps: float,
    modality_sizes: list[int] | None,
    sinkhorn_iterations: int,
    sinkhorn_eps: float,
    out_dtype: torch.dtype | None,
    provider: str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    call = validate(
        streams,
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
        compiling=True,
    )
    kernel, name = dispatcher().kernel(SPEC, call.key, provider)
    out = SPEC.run(kernel, call)
    scope = _shadow.sampling()
    if scope is not None:
        _shadow.observe(scope, SPEC, name, call, out)
    h, post, res = out
    return dense(h), dense(post), dense(res)


@_mhc_pre_op.register_fake
def _(
    streams: torch.Tensor,
    norm_weight: torch.Tensor,
    phi: torch.Tensor,
    alpha_pre: torch.Tensor,
    alpha_post: torch.Tensor,
    alpha_res: torch.Tensor,
    bias_pre: torch.Tensor,
    bias_post: torch.Tensor,
    bias_res: torch.Tensor,
    eps: float,
    modality_sizes: list[int] | None,
    sinkhorn_iterations: int,
    sinkhorn_eps: float,
    out_dtype: torch.dtype | None,
    provider: str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t, n, d = streams.shape
    od = out_dtype or streams.dtype
    return streams.new_empty((t, d)), streams.new_empty((t, n), dtype=od), streams.new_empty((t, n, n), dtype=od)


class MHCPreSpec(OpSpec[MHCPreCall, MHCPreKey]):
    name = OP
    family = "mhc"
    key_type = MHCPreKey
    arg_names = ("streams", *_PARAMS)
    kernel_protocol = MHCPreKernel

    def validate_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> MHCPreCall:
        kw = dict(kwargs)
        return validate(
            *args,
            eps=kw.pop("eps", DEFAULT_EPS),
            modality_sizes=kw.pop("modality_sizes", None),
            sinkhorn_iterations=kw.pop("sinkhorn_iterations", DEFAULT_SINKHORN_ITERATIONS),
            sinkhorn_eps=kw.pop("sinkhorn_eps", DEFAULT_SINKHORN_EPS),
            out_dtype=kw.pop("out_dtype", None),
            compiling=False,
            **kw,
        )

    def outputs(self, out: Any) -> dict[str, torch.Tensor]:
        h, post, res = out
        return {"branch_input": h, "post": post, "residual": res}

    def accept(
        self, problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: Any
    ) -> list[acc.Acceptance]:
        return [
            acc.accept_mhc_branch_input(got["branch_input"], ref["branch_input"], call.streams),
            acc.accept_mhc_coefficients(got["post"], ref["post"], "post"),
            acc.accept_mhc_coefficients(got["residual"], ref["residual"], "residual"),
        ]


SPEC = MHCPreSpec()
