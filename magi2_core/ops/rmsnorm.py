"""The ``rmsnorm`` operator: FP32 normalisation with modality-major ``(w + 1)`` scales.

``x [T, D]`` or ``[T, ..., P', D]`` with tokens on dim 0; ``weight [M, P, D]`` (a flat ``[M·P·D]``
parameter is viewed so, given ``modality_sizes``). Token group m (contiguous, host-side sizes summing
to T, empty groups allowed) is scaled by ``w[m] + 1``; P = 1 broadcasts over the pattern axis, P > 1
needs ``x.shape[-2] == P``. The output is cast once to ``out_dtype or x.dtype``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import torch

from magi2_core.contracts import _checks as checks
from magi2_core.contracts import acceptance as acc
from magi2_core.errors import InvalidShapeError
from magi2_core.ops._args import TENSOR, Arg, Args, eps_arg, modality_sizes_arg, out_dtype_arg, record
from magi2_core.ops._compiled import custom_op, fake_like
from magi2_core.ops._lookup import cache_lookup
from magi2_core.ops._spec import OpSpec, forward_only
from magi2_core.selection import shadow as _shadow

__all__ = ["ARGS", "DEFAULT_EPS", "SPEC", "RMSNormCall", "RMSNormKernel", "RMSNormKey", "rmsnorm", "validate"]

OP: Literal["rmsnorm"] = "rmsnorm"
DEFAULT_EPS = 1e-6


class RMSNormKey(NamedTuple):
    """The typed problem of an RMSNorm call: what provider selection may depend on."""

    device: torch.device | str
    dtype: str
    out_dtype: str
    features: int
    tokens: int
    width: int
    num_modalities: int
    num_patterns: int


class RMSNormCall(NamedTuple):
    """One validated RMSNorm call: what a provider receives, whole and frozen (the core API 2 ABI).

    ``weight`` is ``[M, P, D]`` (a flat parameter viewed so), ``modality_sizes`` a tuple of host ints
    or ``None`` (one modality), ``out_dtype`` resolved. The tensors come first: a repeated layout
    reuses the rest.
    """

    x: torch.Tensor
    weight: torch.Tensor
    eps: float
    modality_sizes: tuple[int, ...] | None
    out_dtype: torch.dtype
    key: RMSNormKey


# The arguments of :func:`rmsnorm` (without ``provider``), declared once: see :mod:`magi2_core.ops._args`.
ARGS = Args(
    OP,
    (
        Arg(
            "x",
            "torch.Tensor",
            "``[T, D]`` or ``[T, ..., P, D]`` (e.g. ``[T, H, D]`` for a q/k norm), BF16, FP16 or "
            "FP32; tokens sorted by modality. Normalised over the last axis.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "weight",
            "torch.Tensor",
            "the delta-scale (the scale is ``w + 1``), any float dtype, on x's device: "
            "``[M, D]`` (one row per modality), ``[M, P, D]`` (P rows per modality, matched to x's second-to-last "
            "axis; P = 1 broadcasts over it) or flat ``[M·P·D]``, M-major.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        eps_arg("a finite float >= 0 added to the mean square.", DEFAULT_EPS),
        modality_sizes_arg(
            "host-side ints, the sizes of the M contiguous token groups, summing to T (None: one modality, M = 1)."
        ),
        out_dtype_arg(),
    ),
)
_TENSORS = 2  # the leading tensor fields of RMSNormCall; a cache hit reuses the fields after them


class RMSNormKernel(Protocol):
    """What an ``rmsnorm`` provider's kernel object is called with: one :class:`RMSNormCall`."""

    def __call__(self, call: RMSNormCall) -> torch.Tensor:
        """Return the normalised, scaled ``x`` cast once to ``call.out_dtype``."""
        ...


def _weight_layouts(m: int, d: int) -> str:
    """The weight layouts a call with ``m`` modalities of width ``d`` accepts, for an error message."""
    return (
        f"[{m}, P, {d}] (modalities, patterns P, width), [{m}, {d}] (P = 1), or flat [{m}·P·{d}]; "
        f"P is the number of scale rows per modality: x's second-to-last axis, or 1 to broadcast"
    )


def validate(
    x: object,
    weight: object,
    *,
    eps: float,
    modality_sizes: object,
    out_dtype: torch.dtype | None,
    compiling: bool,
) -> RMSNormCall:
    """Check every argument (raising an input error that names it) and normalise the inputs."""
    x = checks.float_input(OP, "x", x)
    if x.dim() < 2:
        raise InvalidShapeError(OP, "x", "[tokens, D] or [tokens, ..., patterns, D] (at least 2-D)", checks.describe(x))
    t, d = x.shape[0], x.shape[-1]
    w = checks.tensor(OP, "weight", weight)
    checks.dtype_in(OP, "weight", w, checks.FLOATS)
    checks.same_device(OP, "x", x, weight=w)
    sizes = checks.modality_sizes(OP, modality_sizes, t, "x.shape[0]")
    m = len(sizes) if sizes is not None else 1
    accepted = _weight_layouts(m, d)
    if w.dim() == 1:
        if w.numel() % max(m * d, 1) != 0 or (d == 0 and w.numel() != 0):
            raise InvalidShapeError(OP, "weight", accepted, checks.describe(w))
        # an empty width says nothing about P: one pattern, which broadcasts over any
        w = w.view(m, w.numel() // (m * d) if d else 1, d)
    elif w.dim() == 2 and tuple(w.shape) == (m, d):  # one scale row per modality: P = 1
        w = w.view(m, 1, d)
    if w.dim() != 3 or w.shape[0] != m or w.shape[2] != d:
        raise InvalidShapeError(OP, "weight", accepted, checks.describe(w))
    p = w.shape[1]
    if p != 1 and (x.dim() < 3 or x.shape[-2] != p):
        raise InvalidShapeError(OP, "x", f"[tokens, ..., {p}, {d}] to match weight's {p} patterns", checks.describe(x))
    e = checks.non_negative(OP, "eps", eps)
    od = checks.out_dtype(OP, out_dtype, x.dtype)
    call = RMSNormCall(x, w, e, sizes, od, None)  # type: ignore[arg-type]
    mask = ARGS.features(call, compiling)
    return call._replace(key=RMSNormKey(x.device, checks.dtype_name(x.dtype), checks.dtype_name(od), mask, t, d, m, p))


class _Layout(NamedTuple):
    kernel: Any
    provider: str
    rest: tuple[Any, ...]  # the validated call's fields after its tensors (scalars and the key)
    view: torch.Size | None  # a flat weight's [M, P, D] shape


def _make(kernel: Any, name: str, call: RMSNormCall, args: tuple[Any, ...]) -> _Layout:
    """What a repeated call of this layout reuses (``args``: the declared arguments)."""
    return _Layout(kernel, name, call[_TENSORS:], call.weight.shape if call.weight is not args[1] else None)


@ARGS.public
def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float = DEFAULT_EPS,
    modality_sizes: Sequence[int] | None = None,
    out_dtype: torch.dtype | None = None,
    provider: str | None = None,
) -> torch.Tensor:
    """Multi-modality RMSNorm: ``x·rsqrt(mean(x²)+eps)·(w[m]+1)`` in FP32, cast once.

    Returns:
        ``y``, x's shape, in ``out_dtype``.
    """
    if torch.is_grad_enabled() and (getattr(x, "requires_grad", False) or getattr(weight, "requires_grad", False)):
        forward_only(OP, x=x, weight=weight)
    args = (x, weight, eps, modality_sizes, out_dtype)
    if torch.compiler.is_compiling():
        y: torch.Tensor = ARGS.compiled(args, provider)
        return y
    b = _bind(args, provider)
    if b.view is not None:
        weight = weight.view(b.view)
    # one record per call, built without the NamedTuple's Python __new__ (concatenation: faster than *)
    call: RMSNormCall = record(RMSNormCall, (x, weight) + b.rest)  # noqa: RUF005
    out: torch.Tensor = b.kernel(call)
    return _shadow.observed(SPEC, b.provider, call, out)


def _accept(
    problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: RMSNormCall
) -> list[acc.Acceptance]:
    return [acc.accept_rmsnorm(got["y"], ref["y"])]


SPEC: OpSpec[RMSNormCall, RMSNormKey] = OpSpec(ARGS, RMSNormKey, validate, outputs=("y",), accept=_accept)
_bind: Callable[..., _Layout] = cache_lookup(SPEC, _make)
custom_op(SPEC, torch.Tensor, fake_like("x"))
