"""The ``mhc_pre`` operator: an mHC branch's input and its post / residual coefficients (operators.md §5).

From the ``[T, n, D]`` hyper-connection streams: the FP32 multi-modality RMSNorm of each token's
flattened ``n·D`` row (``(w[m] + 1)`` scales), its FP32 projection to ``2n + n²`` logits, the sigmoid
pre coefficients and the weighted stream sum (the branch input), the post coefficients and the
Sinkhorn-normalised residual matrix. Rounding points are vllm-omni 0.30.0's native ones: the pre
coefficients and the branch input in the streams' dtype, post and residual once in ``out_dtype``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import torch

from magi2_core.contracts import _checks as checks
from magi2_core.contracts import acceptance as acc
from magi2_core.errors import InvalidDTypeError, InvalidShapeError, InvalidValueError
from magi2_core.ops._args import TENSOR, Arg, Args, eps_arg, modality_sizes_arg, out_dtype_arg, record
from magi2_core.ops._compiled import custom_op
from magi2_core.ops._lookup import Layout, cache_lookup, keep_scalars
from magi2_core.ops._spec import OpSpec, forward_only
from magi2_core.selection import shadow as _shadow

__all__ = [
    "ARGS",
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

    ``streams`` is ``[T, n, D]``; ``norm_weight`` FP32 as the caller passed it, flat ``[M·n·D]`` or
    ``[M, n·D]`` (modality-major either way; ``key.num_modalities`` is M: a provider that wants rows
    reshapes it, and one that reads it by pointer needs no view, which the hot path would pay for); ``phi``
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


# The arguments of :func:`mhc_pre` (without ``provider``), declared once: see :mod:`magi2_core.ops._args`.
ARGS = Args(
    OP,
    (
        Arg(
            "streams",
            "torch.Tensor",
            "``[T, n, D]`` hyper-connection streams, BF16, FP16 or FP32, tokens sorted by modality.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "norm_weight",
            "torch.Tensor",
            "the mHC norm's delta-scale (the scale is ``w + 1``), FP32, flat ``[M·n·D]`` "
            "or ``[M, n·D]``, modality-major.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "phi",
            "torch.Tensor",
            "``[n·D, 2n + n²]`` FP32 projection (pre, post, residual columns).",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg("alpha_pre", "torch.Tensor", "one-element FP32 tensors.", schema=torch.Tensor, layout=TENSOR),
        Arg("alpha_post", "torch.Tensor", "", schema=torch.Tensor, layout=TENSOR),
        Arg("alpha_res", "torch.Tensor", "", schema=torch.Tensor, layout=TENSOR),
        Arg("bias_pre", "torch.Tensor", "``[n]`` FP32.", schema=torch.Tensor, layout=TENSOR),
        Arg("bias_post", "torch.Tensor", "", schema=torch.Tensor, layout=TENSOR),
        Arg("bias_res", "torch.Tensor", "``[n, n]`` FP32.", schema=torch.Tensor, layout=TENSOR),
        eps_arg("the norm's eps, a finite float >= 0.", DEFAULT_EPS),
        modality_sizes_arg("host-side ints, the M contiguous token groups' sizes (None: M = 1)."),
        Arg(
            "sinkhorn_iterations",
            "int",
            "Sinkhorn-Knopp iterations (>= 0).",
            DEFAULT_SINKHORN_ITERATIONS,
            schema=int,
            to_schema=int,
        ),
        Arg("sinkhorn_eps", "float", "the eps of its divisions.", DEFAULT_SINKHORN_EPS, schema=float, to_schema=float),
        out_dtype_arg("the post and residual coefficients' dtype (None: the streams' dtype, as upstream)."),
    ),
)
_TENSORS = 9  # the leading tensor fields of MHCPreCall; a cache hit reuses the fields after them


class MHCPreKernel(Protocol):
    """What an ``mhc_pre`` provider's kernel object is called with: one :class:`MHCPreCall`."""

    def __call__(self, call: MHCPreCall) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return ``(branch_input [T, D] in the streams' dtype, post [T, n], residual [T, n, n])``, the
        coefficients in ``call.out_dtype``."""
        ...


def _fp32_param(name: str, value: object, shape: tuple[int, ...] | None, layout: str) -> torch.Tensor:
    t = checks.tensor(OP, name, value)
    if t.dtype != torch.float32:
        raise InvalidDTypeError(
            OP, name, "a float32 tensor (the mHC parameters are FP32, as in the checkpoint)", checks.describe(t)
        )
    if shape is not None and tuple(t.shape) != shape:
        raise InvalidShapeError(OP, name, layout, checks.describe(t))
    return t


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
    x = checks.float_input(OP, "streams", streams)
    t, n, d = checks.rows_3d(OP, "streams", x, "[tokens, n, D] with n >= 1 streams of width D >= 1")
    sizes = checks.modality_sizes(OP, modality_sizes, t, "streams.shape[0]")
    m = 1 if sizes is None else len(sizes)
    w = _fp32_param("norm_weight", norm_weight, None, "")
    if tuple(w.shape) not in ((m * n * d,), (m, n * d)):
        raise InvalidShapeError(
            OP,
            "norm_weight",
            f"[{m}·{n * d}] (flat, modality-major) or [{m}, {n * d}]: {m} modalities of the flattened stream width n·D",
            checks.describe(w),
        )
    nl = 2 * n + n * n
    p = _fp32_param("phi", phi, (n * d, nl), f"[{n * d}, {nl}]: n·D rows, 2n + n² columns (pre, post, residual)")
    a_pre, a_post, a_res = (
        _fp32_param(name, v, None, "")
        for name, v in (("alpha_pre", alpha_pre), ("alpha_post", alpha_post), ("alpha_res", alpha_res))
    )
    for name, a in (("alpha_pre", a_pre), ("alpha_post", a_post), ("alpha_res", a_res)):
        if a.numel() != 1:
            raise InvalidShapeError(OP, name, "a one-element tensor (a scalar, or shape [1])", checks.describe(a))
    b_pre = _fp32_param("bias_pre", bias_pre, (n,), f"[{n}]")
    b_post = _fp32_param("bias_post", bias_post, (n,), f"[{n}]")
    b_res = _fp32_param("bias_res", bias_res, (n, n), f"[{n}, {n}]")
    params = (w, p, a_pre, a_post, a_res, b_pre, b_post, b_res)
    checks.same_device(OP, "streams", x, **dict(zip(_PARAMS, params, strict=True)))
    e = checks.non_negative(OP, "eps", eps)
    se = checks.non_negative(OP, "sinkhorn_eps", sinkhorn_eps)
    if isinstance(sinkhorn_iterations, bool) or not isinstance(sinkhorn_iterations, int) or sinkhorn_iterations < 0:
        raise InvalidValueError(OP, "sinkhorn_iterations", "an int >= 0", repr(sinkhorn_iterations))
    od = checks.out_dtype(OP, out_dtype, x.dtype)
    call = MHCPreCall(x, w, p, a_pre, a_post, a_res, b_pre, b_post, b_res, e, sizes, sinkhorn_iterations, se, od, None)  # type: ignore[arg-type]
    mask = ARGS.features(call, compiling)
    return call._replace(key=MHCPreKey(x.device, checks.dtype_name(x.dtype), checks.dtype_name(od), mask, t, n, d, m))


@ARGS.public
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

    Returns:
        ``(branch_input [T, D] in the streams' dtype, post [T, n], residual [T, n, n])``.
    """
    tensors = (streams, norm_weight, phi, alpha_pre, alpha_post, alpha_res, bias_pre, bias_post, bias_res)
    try:  # written out: a generator over the nine costs twice as much per call
        asks_grad = torch.is_grad_enabled() and (
            streams.requires_grad
            or norm_weight.requires_grad
            or phi.requires_grad
            or alpha_pre.requires_grad
            or alpha_post.requires_grad
            or alpha_res.requires_grad
            or bias_pre.requires_grad
            or bias_post.requires_grad
            or bias_res.requires_grad
        )
    except AttributeError:  # not a tensor: validation says which argument
        asks_grad = False
    if asks_grad:
        forward_only(OP, **dict(zip(("streams", *_PARAMS), tensors, strict=True)))
    args = (*tensors, eps, modality_sizes, sinkhorn_iterations, sinkhorn_eps, out_dtype)
    if torch.compiler.is_compiling():
        out: tuple[torch.Tensor, torch.Tensor, torch.Tensor] = ARGS.compiled(args, provider)
        return out
    b = _bind(args, provider)
    call: MHCPreCall = record(MHCPreCall, tensors + b.rest)
    out = b.kernel(call)
    return _shadow.observed(SPEC, b.provider, call, out)


def _accept(
    problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: MHCPreCall
) -> list[acc.Acceptance]:
    return [
        acc.accept_mhc_branch_input(got["branch_input"], ref["branch_input"], call.streams),
        acc.accept_mhc_coefficients(got["post"], ref["post"], "post"),
        acc.accept_mhc_coefficients(got["residual"], ref["residual"], "residual"),
    ]


SPEC: OpSpec[MHCPreCall, MHCPreKey] = OpSpec(
    ARGS, MHCPreKey, validate, outputs=("branch_input", "post", "residual"), accept=_accept
)
_bind: Callable[..., Layout] = cache_lookup(SPEC, keep_scalars(_TENSORS))


def _fake(a: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t, n, d = a["streams"].shape
    od = a["out_dtype"] or a["streams"].dtype
    return (
        a["streams"].new_empty((t, d)),
        a["streams"].new_empty((t, n), dtype=od),
        a["streams"].new_empty((t, n, n), dtype=od),
    )


custom_op(SPEC, tuple[torch.Tensor, torch.Tensor, torch.Tensor], _fake)
