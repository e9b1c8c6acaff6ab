"""The ``qk_norm_rope`` operator: a per-head q/k RMSNorm, a row gather and RoPE, cast once.

MAGI-2's attention input (vllm-omni 0.30.0's ``Magi2Attention.project``) normalises q and k per head in
FP32 with modality ``(w + 1)`` scales (tokens in modality order), moves the rows back to sequence order
(``inverse_permute``), rotates the first ``R`` dims of each head by the token's RoPE angles in FP32 and
casts to the checkpoint dtype. Upstream writes an FP32 tensor between each step; this op is the chain:

``n = x[src]·rsqrt(mean(x[src]²) + eps)·(w[m(src)] + 1)`` (FP32), ``src = index[t]`` (or ``t``);
``y[t, h, i] = n_i·cos[t, i mod R/2] ∓ n_(i ± R/2)·sin[t, i mod R/2]`` for ``i < R`` (minus below R/2,
plus from R/2: the half-split pairs of upstream's ``rotate_half``), ``y = n`` for ``i >= R``; one cast.
``rope [T, R]`` is ``cat(sin, cos)`` along its last axis, as vllm-omni's ``ElementWiseFourierEmbed`` gives
it (``rope.tensor_split(2, -1)`` is ``sin, cos``), indexed by the output token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import torch

from magi2_core.contracts import _checks as checks
from magi2_core.contracts import acceptance as acc
from magi2_core.errors import InvalidShapeError
from magi2_core.ops._args import TENSOR, Arg, Args, eps_arg, index_arg, modality_sizes_arg, out_dtype_arg, record
from magi2_core.ops._compiled import custom_op, fake_like
from magi2_core.ops._lookup import cache_lookup
from magi2_core.ops._spec import OpSpec, forward_only
from magi2_core.selection import shadow as _shadow

__all__ = ["ARGS", "DEFAULT_EPS", "SPEC", "QKNormRopeCall", "QKNormRopeKernel", "QKNormRopeKey", "qk_norm_rope"]

OP: Literal["qk_norm_rope"] = "qk_norm_rope"
DEFAULT_EPS = 1e-6


class QKNormRopeKey(NamedTuple):
    """The typed problem of a ``qk_norm_rope`` call."""

    device: torch.device | str
    dtype: str
    out_dtype: str
    features: int
    tokens: int
    num_heads: int
    head_dim: int
    rotary_dim: int
    num_modalities: int


class QKNormRopeCall(NamedTuple):
    """One validated ``qk_norm_rope`` call: ``x [T, H, D]`` (any strides), ``weight [M, D]`` (a flat
    parameter viewed so), ``rope [T, R]``, ``index [T]`` or ``None``, host ``modality_sizes`` or ``None``
    (one modality), ``out_dtype`` resolved."""

    x: torch.Tensor
    weight: torch.Tensor
    rope: torch.Tensor
    index: torch.Tensor | None  # type: ignore[assignment]  # the argument's name; shadows tuple.index (unused)
    eps: float
    modality_sizes: tuple[int, ...] | None
    out_dtype: torch.dtype
    key: QKNormRopeKey


# The arguments of :func:`qk_norm_rope` (without ``provider``), declared once: see :mod:`magi2_core.ops._args`.
ARGS = Args(
    OP,
    (
        Arg(
            "x",
            "torch.Tensor",
            "``[T, H, D]`` q or k heads, BF16, FP16 or FP32 (any strides: a view of the packed QKV "
            "projection is read in place); rows in modality order, as the norm sees them.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "weight",
            "torch.Tensor",
            "the norm's delta-scale (the scale is ``w + 1``), any float dtype: ``[M, D]`` or flat "
            "``[M·D]``, one row per modality, shared by the heads.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "rope",
            "torch.Tensor",
            "``[T, R]``, ``cat(sin, cos)`` of the output tokens' angles (R even, 2 <= R <= D), any float dtype; "
            "the first R dims of each head rotate in half-split pairs, the rest pass through.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        eps_arg("a finite float >= 0 added to the mean square.", DEFAULT_EPS),
        modality_sizes_arg(
            "host-side ints, the sizes of the M contiguous groups of x's rows, summing to T (None: M = 1)."
        ),
        index_arg("inverse_permute"),
        out_dtype_arg(),
    ),
)
_TENSORS = 4  # the leading tensor fields of QKNormRopeCall; a cache hit reuses the fields after them


class QKNormRopeKernel(Protocol):
    """What a ``qk_norm_rope`` provider's kernel object is called with: one :class:`QKNormRopeCall`."""

    def __call__(self, call: QKNormRopeCall) -> torch.Tensor:
        """Return a new contiguous ``[T, H, D]`` tensor in ``call.out_dtype``."""
        ...


def validate(
    x: object,
    weight: object,
    rope: object,
    *,
    eps: float,
    modality_sizes: object,
    index: object,
    out_dtype: torch.dtype | None,
    compiling: bool,
) -> QKNormRopeCall:
    """Check every argument (raising an input error that names it) and normalise the inputs."""
    x = checks.float_input(OP, "x", x)
    t, h, d = checks.rows_3d(OP, "x", x, "[tokens, heads H >= 1, head dim D >= 2]", 2)
    w = checks.tensor(OP, "weight", weight)
    checks.dtype_in(OP, "weight", w, checks.FLOATS)
    sizes = checks.modality_sizes(OP, modality_sizes, t, "x.shape[0]")
    m = len(sizes) if sizes is not None else 1
    if w.dim() == 1 and w.numel() == m * d:
        w = w.view(m, d)
    if tuple(w.shape) != (m, d):
        raise InvalidShapeError(
            OP, "weight", f"[{m}, {d}] (modalities, head dim) or flat [{m * d}]", checks.describe(w)
        )
    r = checks.tensor(OP, "rope", rope)
    checks.dtype_in(OP, "rope", r, checks.FLOATS)
    if r.dim() != 2 or r.shape[0] != t or r.shape[1] % 2 or not 2 <= r.shape[1] <= d:
        raise InvalidShapeError(
            OP, "rope", f"[{t}, R]: cat(sin, cos) per token, R even and 2 <= R <= {d}", checks.describe(r)
        )
    idx = checks.gather_index(OP, index, t)
    checks.same_device(OP, "x", x, weight=w, rope=r, index=idx)
    e = checks.non_negative(OP, "eps", eps)
    od = checks.out_dtype(OP, out_dtype, x.dtype)
    call = QKNormRopeCall(x, w, r, idx, e, sizes, od, None)  # type: ignore[arg-type]
    mask = ARGS.features(call, compiling)
    key = QKNormRopeKey(x.device, checks.dtype_name(x.dtype), checks.dtype_name(od), mask, t, h, d, r.shape[1], m)
    return call._replace(key=key)


class _Layout(NamedTuple):
    kernel: Any
    provider: str
    rest: tuple[Any, ...]  # the validated call's fields after its tensors (scalars and the key)
    view: torch.Size | None  # a flat weight's [M, D] shape


def _make(kernel: Any, name: str, call: QKNormRopeCall, args: tuple[Any, ...]) -> _Layout:
    """What a repeated call of this layout reuses (``args``: the declared arguments)."""
    return _Layout(kernel, name, call[_TENSORS:], call.weight.shape if call.weight is not args[1] else None)


@ARGS.public
def qk_norm_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    rope: torch.Tensor,
    *,
    eps: float = DEFAULT_EPS,
    modality_sizes: Sequence[int] | None = None,
    index: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    provider: str | None = None,
) -> torch.Tensor:
    """Per-head multi-modality RMSNorm of q or k, the gather ``index``, then RoPE, in FP32, cast once.

    Returns:
        ``y``, a new contiguous ``[T, H, D]`` tensor in ``out_dtype``, rows in output (sequence) order.
    """
    if torch.is_grad_enabled() and (
        getattr(x, "requires_grad", False)
        or getattr(weight, "requires_grad", False)
        or getattr(rope, "requires_grad", False)
    ):
        forward_only(OP, x=x, weight=weight, rope=rope)
    args = (x, weight, rope, eps, modality_sizes, index, out_dtype)
    if torch.compiler.is_compiling():
        y: torch.Tensor = ARGS.compiled(args, provider)
        return y
    b = _bind(args, provider)
    if b.view is not None:
        weight = weight.view(b.view)
    call: QKNormRopeCall = record(QKNormRopeCall, (x, weight, rope, index) + b.rest)  # noqa: RUF005
    out: torch.Tensor = b.kernel(call)
    return _shadow.observed(SPEC, b.provider, call, out)


def _accept(
    problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: QKNormRopeCall
) -> list[acc.Acceptance]:
    return [acc.accept_qk_norm_rope(got["y"], ref["y"], call)]


SPEC: OpSpec[QKNormRopeCall, QKNormRopeKey] = OpSpec(ARGS, QKNormRopeKey, validate, outputs=("y",), accept=_accept)
_bind: Callable[..., _Layout] = cache_lookup(SPEC, _make)
custom_op(SPEC, torch.Tensor, fake_like("x"))
