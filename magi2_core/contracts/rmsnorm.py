"""RMSNorm contract: FP32 normalisation with modality-major ``(w + 1)`` scales (spec §4).

``x [T, D]`` or ``[T, ..., P', D]`` with tokens on dim 0; ``weight [M, P, D]`` (a flat ``[M·P·D]``
parameter is viewed so, given ``modality_sizes``). Token group m (contiguous, host-side sizes summing
to T, empty groups allowed) is scaled by ``w[m] + 1``; P = 1 broadcasts over the pattern axis, P > 1
needs ``x.shape[-2] == P``. The output is cast once to ``out_dtype or x.dtype``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import torch

from magi2_core.contracts import _checks as ck
from magi2_core.errors import InvalidDTypeError, InvalidShapeError, InvalidValueError
from magi2_core.problem import FEATURE_BIT, Feature, Problem, features_from_mask

__all__ = ["DEFAULT_EPS", "KEY_FIELDS", "OP", "RMSNormCall", "problem_from_raw", "validate"]

OP: Literal["rmsnorm"] = "rmsnorm"
DEFAULT_EPS = 1e-6
KEY_FIELDS = ("tokens", "width", "num_modalities", "num_patterns")
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


class RMSNormCall(NamedTuple):
    x: torch.Tensor
    weight: torch.Tensor
    eps: float
    modality_sizes: tuple[int, ...] | None
    out_dtype: torch.dtype
    raw: tuple[Any, ...]


def validate(
    x: object,
    weight: object,
    *,
    eps: float,
    modality_sizes: object,
    out_dtype: torch.dtype | None,
    compiling: bool,
) -> RMSNormCall:
    x = ck.tensor(OP, "x", x)
    ck.with_data(OP, "x", x)
    ck.dtype_in(OP, "x", x, _FLOATS)
    if x.dim() < 2:
        raise InvalidShapeError(OP, "x", "[tokens, D] or [tokens, ..., patterns, D] (at least 2-D)", ck.describe(x))
    t, d = x.shape[0], x.shape[-1]
    w = ck.tensor(OP, "weight", weight)
    ck.dtype_in(OP, "weight", w, _FLOATS)
    ck.same_device(OP, "x", x, weight=w)
    sizes: tuple[int, ...] | None = None
    if modality_sizes is not None:
        if isinstance(modality_sizes, torch.Tensor):
            raise InvalidShapeError(
                OP,
                "modality_sizes",
                "a host-side list of ints (not a tensor: no device sync)",
                ck.describe(modality_sizes),
            )
        if not isinstance(modality_sizes, Sequence):
            raise InvalidShapeError(OP, "modality_sizes", "a list of ints or None", type(modality_sizes).__name__)
        sizes = tuple(modality_sizes)
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sizes):
            raise InvalidShapeError(OP, "modality_sizes", "a non-empty list of non-negative ints", repr(modality_sizes))
        if sum(sizes) != t:
            raise InvalidShapeError(
                OP,
                "modality_sizes",
                f"sizes summing to the token count x.shape[0] = {t}",
                f"{list(sizes)} (sum {sum(sizes)})",
            )
    m = len(sizes) if sizes is not None else 1
    if w.dim() == 1:
        if d == 0 or w.numel() % (m * d) != 0:
            raise InvalidShapeError(OP, "weight", f"[M·P·D] with M = {m} modalities and D = {d}", ck.describe(w))
        w = w.view(m, w.numel() // (m * d), d)
    if w.dim() != 3 or w.shape[0] != m or w.shape[2] != d:
        raise InvalidShapeError(OP, "weight", f"[{m}, P, {d}] (modalities, patterns, width)", ck.describe(w))
    p = w.shape[1]
    if p != 1 and (x.dim() < 3 or x.shape[-2] != p):
        raise InvalidShapeError(OP, "x", f"[tokens, ..., {p}, {d}] to match weight's {p} patterns", ck.describe(x))
    e = ck.real(OP, "eps", eps, "a finite float >= 0")
    if not math.isfinite(e) or e < 0:  # eps = 0 is allowed: an all-zero row is then 0/0 = NaN, by definition
        raise InvalidValueError(OP, "eps", "a finite float >= 0", repr(eps))
    od = x.dtype if out_dtype is None else out_dtype
    if od not in _FLOATS:
        raise InvalidDTypeError(
            OP, "out_dtype", "None, torch.float32, torch.bfloat16 or torch.float16", repr(out_dtype)
        )
    mask = FEATURE_BIT[Feature.COMPILING] if compiling else 0
    raw = (x.device, ck.dtype_name(x.dtype), ck.dtype_name(od), mask, t, d, m, p)
    return RMSNormCall(x, w, e, sizes, od, raw)


def problem_from_raw(raw: tuple[Any, ...]) -> Problem:
    device, dtype, out_dtype, mask, *ints = raw
    device_type, device_index = ck.device_fields(device)
    return Problem(
        op=OP,
        device_type=device_type,
        device_index=device_index,
        dtype=str(dtype),
        out_dtype=str(out_dtype),
        features=features_from_mask(int(mask)),
        **dict(zip(KEY_FIELDS, ints, strict=True)),
    )
