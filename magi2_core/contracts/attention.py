"""Attention contract: packed variable-length attention with learned sinks (spec §2).

``validate`` checks every argument before any kernel runs and returns an :class:`AttentionCall`
with normalised inputs: int32 prefix sums on q's device, integer max lengths, the softmax scale,
``max(softcap, 0)`` and ``sinks`` as ``None`` or FP32 ``[S, Hq]`` with ``S >= 1``.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Literal, NamedTuple

import torch

from magi2_core.contracts import _checks as ck
from magi2_core.errors import InvalidDeviceError, InvalidDTypeError, InvalidShapeError, InvalidValueError
from magi2_core.problem import FEATURE_BIT, Feature, Problem, features_from_mask
from magi2_core.provider import SinkRescale

__all__ = ["ACTIVATION_DTYPES", "KEY_FIELDS", "OP", "AttentionCall", "problem_from_raw", "validate"]

OP: Literal["attention"] = "attention"
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
KEY_FIELDS = (
    "tokens",
    "tokens_k",
    "max_seqlen_q",
    "max_seqlen_k",
    "num_segments",
    "head_dim",
    "num_heads_q",
    "num_heads_kv",
)


class AttentionCall(NamedTuple):
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    softmax_scale: float
    softcap: float
    sinks: torch.Tensor | None
    sink_rescale: SinkRescale
    deterministic: bool
    return_lse: bool
    raw: tuple[Any, ...]


def _prefix_sums(arg: str, cu: object, total: int, device: torch.device) -> tuple[torch.Tensor, list[int] | None]:
    t = ck.tensor(OP, arg, cu)
    if t.dim() != 1 or t.numel() < 1:
        raise InvalidShapeError(OP, arg, "a 1-D prefix-sum tensor [B+1] with B >= 0", ck.describe(t))
    dtype = t.dtype
    if dtype is not torch.int32 and dtype is not torch.int64:
        ck.dtype_in(OP, arg, t, (torch.int32, torch.int64))  # raises, naming both
    where = t.device
    on_host = where.type == "cpu"
    if not on_host and where.type != device.type:
        raise InvalidDeviceError(OP, arg, f"on the host or on {device} like q", ck.describe(t))
    values = t.tolist() if on_host else None
    if dtype is torch.int32 and where == device and t.is_contiguous():
        return t, values  # the common case: no conversion call on the hot path
    return t.to(device=device, dtype=torch.int32, non_blocking=True).contiguous(), values


def _check_values(arg: str, values: list[int], total: int, n_tokens_arg: str) -> int:
    if values[0] != 0:
        raise InvalidShapeError(OP, arg, "a prefix sum starting at 0", f"first value {values[0]}")
    if values[-1] != total:
        raise InvalidShapeError(
            OP, arg, f"a prefix sum ending at {n_tokens_arg}.shape[0] = {total}", f"last value {values[-1]}"
        )
    lengths = list(map(operator.sub, values[1:], values[:-1]))  # C-level loop: this runs on every call
    if lengths and min(lengths) < 0:
        bad = next(i for i, n in enumerate(lengths) if n < 0)
        raise InvalidShapeError(OP, arg, "non-decreasing", f"{values[bad]} then {values[bad + 1]} at index {bad}")
    return max(lengths, default=0)


def _max_len(arg: str, given: int | None, derived: int | None) -> int:
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 0:
            raise InvalidShapeError(OP, arg, "a non-negative Python int or None", repr(given))
        if derived is not None and given < derived:
            raise InvalidShapeError(OP, arg, f">= the longest segment ({derived})", str(given))
        return given
    assert derived is not None
    return derived


def validate(
    q: object,
    k: object,
    v: object,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    *,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float | None,
    softcap: float,
    sinks: object,
    sink_rescale: str,
    deterministic: bool,
    return_lse: bool,
    compiling: bool,
) -> AttentionCall:
    q = ck.tensor(OP, "q", q)
    ck.with_data(OP, "q", q)
    k = ck.tensor(OP, "k", k)
    v = ck.tensor(OP, "v", v)
    dtype, device = q.dtype, q.device
    # One combined test for the common case; the detailed checks below name what is wrong.
    if not (q.dim() == k.dim() == v.dim() == 3 and dtype in ACTIVATION_DTYPES and k.dtype is dtype
            and v.dtype is dtype and k.device == device and v.device == device):  # fmt: skip
        for arg, t in (("q", q), ("k", k), ("v", v)):
            ck.rank(OP, arg, t, (3,), "[tokens, heads, head_dim]")
        ck.dtype_in(OP, "q", q, ACTIVATION_DTYPES)
        for arg, t in (("k", k), ("v", v)):
            if t.dtype != dtype:
                raise InvalidDTypeError(OP, arg, f"of q's dtype {ck.dtype_name(dtype)}", ck.describe(t))
        ck.same_device(OP, "q", q, k=k, v=v)
    tq, hq, d = q.shape
    tk, hkv, dk = k.shape
    if dk != d or v.shape[2] != d:
        raise InvalidShapeError(OP, "k/v", f"head_dim {d} like q", f"k {list(k.shape)}, v {list(v.shape)}")
    if tuple(v.shape[:2]) != (tk, hkv):
        raise InvalidShapeError(OP, "v", f"[{tk}, {hkv}, {d}] like k", ck.describe(v))
    if hkv == 0 or hq % hkv != 0:
        raise InvalidShapeError(OP, "k", f"a kv head count dividing q's {hq} heads (GQA)", f"{hkv} kv heads")
    cu_q, vals_q = _prefix_sums("cu_seqlens_q", cu_seqlens_q, tq, device)
    cu_k, vals_k = _prefix_sums("cu_seqlens_k", cu_seqlens_k, tk, device)
    if cu_q.numel() != cu_k.numel():
        raise InvalidShapeError(
            OP, "cu_seqlens_k", f"{cu_q.numel()} entries like cu_seqlens_q (same batch)", f"{cu_k.numel()} entries"
        )
    need_values = max_seqlen_q is None or max_seqlen_k is None or ck.device_value_checks()
    if need_values and vals_q is None:  # device prefix sums: one host sync, only when lengths were not given
        vals_q = cu_q.tolist()
    if need_values and vals_k is None:
        vals_k = cu_k.tolist()
    long_q = _check_values("cu_seqlens_q", vals_q, tq, "q") if vals_q is not None else None
    long_k = _check_values("cu_seqlens_k", vals_k, tk, "k") if vals_k is not None else None
    mq = _max_len("max_seqlen_q", max_seqlen_q, long_q)
    mk = _max_len("max_seqlen_k", max_seqlen_k, long_k)
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
    else:
        scale = ck.real(OP, "softmax_scale", softmax_scale, "a finite positive float or None")
        if not math.isfinite(scale) or scale <= 0:
            raise InvalidValueError(OP, "softmax_scale", "a finite positive float or None", repr(softmax_scale))
    cap = ck.real(OP, "softcap", softcap, "a finite float (<= 0 disables it)")
    if math.isnan(cap) or math.isinf(cap):
        raise InvalidValueError(OP, "softcap", "a finite float (<= 0 disables it)", repr(softcap))
    cap = max(cap, 0.0)
    sink_t: torch.Tensor | None = None
    if sinks is not None:
        sink_t = ck.tensor(OP, "sinks", sinks)
        if sink_t.dtype != torch.float32:
            raise InvalidDTypeError(OP, "sinks", "FP32 (sinks are never rounded to the activation dtype)",
                                    ck.describe(sink_t))
        if sink_t.dim() != 2 or sink_t.shape[1] != hq:
            raise InvalidShapeError(OP, "sinks", f"[S, {hq}] (S sink logits per q head)", ck.describe(sink_t))
        ck.same_device(OP, "q", q, sinks=sink_t)
        ck.finite_parameter(OP, "sinks", sink_t)
        if sink_t.shape[0] == 0:
            sink_t = None
    if sink_rescale not in ("fp32", "activation"):
        raise InvalidValueError(OP, "sink_rescale", "'fp32' or 'activation'", repr(sink_rescale))
    mask = (
        (FEATURE_BIT[Feature.SOFTCAP] if cap > 0 else 0)
        | (FEATURE_BIT[Feature.SINKS] if sink_t is not None else 0)
        | (FEATURE_BIT[Feature.GQA] if hq != hkv else 0)
        | (FEATURE_BIT[Feature.LSE] if return_lse else 0)
        | (FEATURE_BIT[Feature.DETERMINISTIC] if deterministic else 0)
        | (FEATURE_BIT[Feature.COMPILING] if compiling else 0)
    )
    # Rules judge the true longest segments where the prefix sums are on the host; with device prefix
    # sums and max_seqlen_* given, they judge the declared bound (Resolution.explain says so).
    rq = mq if long_q is None else long_q
    rk = mk if long_k is None else long_k
    raw = (device, ck.dtype_name(dtype), None, mask, tq, tk, rq, rk, cu_q.numel() - 1, d, hq, hkv)
    return AttentionCall(
        q,
        k,
        v,
        cu_q,
        cu_k,
        mq,
        mk,
        scale,
        cap,
        sink_t,
        sink_rescale,  # type: ignore[arg-type]
        bool(deterministic),
        bool(return_lse),
        raw,
    )


def problem_from_raw(raw: tuple[Any, ...]) -> Problem:
    device, dtype, _, mask, *ints = raw
    device_type, device_index = ck.device_fields(device)
    return Problem(
        op=OP,
        device_type=device_type,
        device_index=device_index,
        dtype=str(dtype),
        features=features_from_mask(int(mask)),
        **dict(zip(KEY_FIELDS, ints, strict=True)),
    )
