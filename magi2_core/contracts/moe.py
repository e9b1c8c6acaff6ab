"""MoE contracts: head-routed sigmoid top-k routing and the BF16 expert schedule (spec §3).

``x [T, Hl, d]``: Hl heads are hidden-state slices, each with its own bank of E experts.
Routing: ``router_weight`` FP32 ``[Hl·E, d]`` head-major, ``bias`` FP32 ``[Hl·E]`` (selection only).
Experts: ``w_gate``/``w_up`` ``[Hl·E, d, I]``, ``w_down`` ``[Hl·E, I, d]``; probs FP32 ``[Hl, T, K]``,
idx ``[Hl, T, K]`` per-head expert ids in ``[0, E)``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from magi2_core.contracts import _checks as ck
from magi2_core.errors import InvalidDTypeError, InvalidShapeError, InvalidValueError
from magi2_core.problem import FEATURE_BIT, Feature, OpName, Problem, features_from_mask

__all__ = [
    "EXPERTS_KEY_FIELDS",
    "ROUTE_KEY_FIELDS",
    "SWIGLU_ALPHA",
    "SWIGLU_LIMIT",
    "ExpertsCall",
    "RouteCall",
    "problem_from_raw",
    "swiglu7",
    "validate_experts",
    "validate_route",
]

SWIGLU_ALPHA = 1.702
SWIGLU_LIMIT = 7.0
ROUTE_KEY_FIELDS = ("tokens", "num_heads", "num_experts", "top_k", "hidden")
EXPERTS_KEY_FIELDS = ("tokens", "num_heads", "num_experts", "top_k", "hidden", "intermediate")
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def swiglu7(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """SwiGLU with clamps, in FP32 (or wider): ``min(g,7)·σ(1.702·min(g,7))·(clamp(u,±7)+1)``."""
    acc = torch.promote_types(g.dtype, torch.float32)
    g = g.to(acc).clamp(max=SWIGLU_LIMIT)
    u = u.to(acc).clamp(-SWIGLU_LIMIT, SWIGLU_LIMIT)
    return g * torch.sigmoid(SWIGLU_ALPHA * g) * (u + 1.0)


def _compiling_bit(compiling: bool) -> int:
    return FEATURE_BIT[Feature.COMPILING] if compiling else 0


class RouteCall(NamedTuple):
    x: torch.Tensor
    router_weight: torch.Tensor
    bias: torch.Tensor | None
    top_k: int
    route_scale: float
    raw: tuple[Any, ...]


def validate_route(
    x: object, router_weight: object, bias: object, *, top_k: int, route_scale: float, compiling: bool
) -> RouteCall:
    op = "moe_route"
    x = ck.tensor(op, "x", x)
    ck.with_data(op, "x", x)
    ck.rank(op, "x", x, (3,), "[tokens, heads, hidden]")
    ck.dtype_in(op, "x", x, _FLOATS)
    t, hl, d = x.shape
    w = ck.tensor(op, "router_weight", router_weight)
    ck.dtype_in(op, "router_weight", w, (torch.float32,))
    if w.dim() != 2 or w.shape[1] != d or hl == 0 or w.shape[0] % hl != 0 or w.shape[0] == 0:
        raise InvalidShapeError(
            op, "router_weight", f"FP32 [heads·experts, {d}] with a multiple of {hl} rows", ck.describe(w)
        )
    e = w.shape[0] // hl
    b: torch.Tensor | None = None
    if bias is not None:
        b = ck.tensor(op, "bias", bias)
        ck.dtype_in(op, "bias", b, (torch.float32,))
        if tuple(b.shape) != (hl * e,):
            raise InvalidShapeError(op, "bias", f"FP32 [{hl * e}] (one per head·expert)", ck.describe(b))
    ck.same_device(op, "x", x, router_weight=w, bias=b)
    if b is not None:
        ck.finite_parameter(op, "bias", b)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise InvalidShapeError(op, "top_k", f"an int in [1, {e}] (experts per head)", repr(top_k))
    scale = ck.real(op, "route_scale", route_scale, "a finite float")
    if not math.isfinite(scale):
        raise InvalidValueError(op, "route_scale", "a finite float", repr(route_scale))
    raw = (x.device, ck.dtype_name(x.dtype), None, _compiling_bit(compiling), t, hl, e, top_k, d)
    return RouteCall(x, w, b, top_k, scale, raw)


class ExpertsCall(NamedTuple):
    x: torch.Tensor
    probs: torch.Tensor
    idx: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    raw: tuple[Any, ...]


def validate_experts(
    x: object,
    probs: object,
    idx: object,
    w_gate: object,
    w_up: object,
    w_down: object,
    *,
    deterministic: bool,
    compiling: bool,
) -> ExpertsCall:
    op = "moe_experts"
    x = ck.tensor(op, "x", x)
    ck.with_data(op, "x", x)
    ck.rank(op, "x", x, (3,), "[tokens, heads, hidden]")
    ck.dtype_in(op, "x", x, _FLOATS)
    t, hl, d = x.shape
    p = ck.tensor(op, "probs", probs)
    i = ck.tensor(op, "idx", idx)
    ck.dtype_in(op, "probs", p, (torch.float32,))
    if p.dim() != 3 or p.shape[0] != hl or p.shape[1] != t or p.shape[2] < 1:
        raise InvalidShapeError(op, "probs", f"FP32 [{hl}, {t}, top_k] (head-major)", ck.describe(p))
    if i.dtype not in (torch.int32, torch.int64):
        raise InvalidDTypeError(op, "idx", "of dtype int32 or int64", ck.describe(i))
    if tuple(i.shape) != tuple(p.shape):
        raise InvalidShapeError(op, "idx", f"shape {list(p.shape)} like probs", ck.describe(i))
    wg = ck.tensor(op, "w_gate", w_gate)
    wu = ck.tensor(op, "w_up", w_up)
    wd = ck.tensor(op, "w_down", w_down)
    if wg.dim() != 3 or hl == 0 or wg.shape[0] % hl != 0 or wg.shape[1] != d or wg.shape[0] == 0:
        raise InvalidShapeError(
            op, "w_gate", f"[heads·experts, {d}, intermediate] with a multiple of {hl} rows", ck.describe(wg)
        )
    f, _, inter = wg.shape
    if tuple(wu.shape) != (f, d, inter):
        raise InvalidShapeError(op, "w_up", f"[{f}, {d}, {inter}] like w_gate", ck.describe(wu))
    if tuple(wd.shape) != (f, inter, d):
        raise InvalidShapeError(op, "w_down", f"[{f}, {inter}, {d}]", ck.describe(wd))
    for arg, w in (("w_gate", wg), ("w_up", wu), ("w_down", wd)):
        if w.dtype != x.dtype:
            raise InvalidDTypeError(op, arg, f"of x's dtype {ck.dtype_name(x.dtype)}", ck.describe(w))
    ck.same_device(op, "x", x, probs=p, idx=i, w_gate=wg, w_up=wu, w_down=wd)
    e = f // hl
    k = p.shape[2]
    if k > e:
        raise InvalidShapeError(op, "probs", f"top_k <= {e} experts per head", f"top_k = {k}")
    if i.numel() and (i.device.type == "cpu" or ck.device_value_checks()) and (int(i.min()) < 0 or int(i.max()) >= e):
        raise InvalidShapeError(
            op, "idx", f"per-head expert ids in [0, {e})", f"values in [{int(i.min())}, {int(i.max())}]"
        )
    mask = _compiling_bit(compiling) | (FEATURE_BIT[Feature.DETERMINISTIC] if deterministic else 0)
    raw = (x.device, ck.dtype_name(x.dtype), None, mask, t, hl, e, k, d, inter)
    return ExpertsCall(x, p, i, wg, wu, wd, raw)


def problem_from_raw(op: OpName, raw: tuple[Any, ...]) -> Problem:
    fields = ROUTE_KEY_FIELDS if op == "moe_route" else EXPERTS_KEY_FIELDS
    device, dtype, _, mask, *ints = raw
    device_type, device_index = ck.device_fields(device)
    return Problem(
        op=op,
        device_type=device_type,
        device_index=device_index,
        dtype=str(dtype),
        features=features_from_mask(int(mask)),
        **dict(zip(fields, ints, strict=True)),
    )
