"""Conformance cases generated from a provider's capability descriptor.

A :class:`Case` is a small, hashable description of one call (sizes, features, dtype, device); the
tensors are built from it later by :mod:`magi2_core.testing.inputs`, seeded per case, so any case
reproduces alone. Generation covers every claimed dtype, head dim (a small default set when the
descriptor does not restrict it), feature and integer range, plus the edge layouts of the contract
(ragged and empty segments, T = 0, empty modality groups). Cases outside a claimed *range* are not
generated; cases that a *rule* makes ineligible are kept, and reported as ineligible rather than run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from magi2_core.capability import Capability
from magi2_core.problem import Feature, OpName, Problem
from magi2_core.resolution import ReasonCode
from magi2_core.resolver import static_reasons

__all__ = ["DEFAULT_HEAD_DIMS", "DEFAULT_MAX_TOKENS", "Case", "generate_cases", "problem_of"]

DEFAULT_HEAD_DIMS = (32, 64)
# Boundary layouts longer than this are not generated (CPU CI stays fast); a range whose minimum is
# larger is still served with one case at its minimum, so every claimed region gets a case.
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class Case:
    """One conformance call: ``op`` through ``provider`` on ``device`` with ``params``."""

    op: OpName
    provider: str
    device: str
    dtype: str
    label: str
    params: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def id(self) -> str:
        return f"{self.op}[{self.provider}]-{self.device}-{self.dtype}-{self.label}"

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)


def _case(op: OpName, cap: Capability, device: str, dtype: str, label: str, params: Mapping[str, Any]) -> Case:
    return Case(op, cap.name, device, dtype, label, tuple(sorted(params.items())))


# ---------------------------------------------------------------------------------------------
# Problems of cases (no tensors): used to keep cases inside the claimed ranges
# ---------------------------------------------------------------------------------------------
def problem_of(case: Case) -> Problem:
    """The :class:`Problem` the op contract will build for ``case`` (what selection sees)."""
    p = case.p
    base: dict[str, Any] = {"op": case.op, "device_type": case.device, "dtype": case.dtype}
    if case.op == "attention":
        lq, lk = p["seqlens_q"], p["seqlens_k"]
        feats = {Feature.SOFTCAP} if p["softcap"] > 0 else set()
        feats |= {Feature.SINKS} if p["sinks"] > 0 else set()
        feats |= {Feature.GQA} if p["hq"] != p["hkv"] else set()
        feats |= {Feature.LSE} if p["lse"] else set()
        feats |= {Feature.DETERMINISTIC} if p["deterministic"] else set()
        return Problem(
            **base,
            features=frozenset(feats),
            tokens=sum(lq),
            tokens_k=sum(lk),
            max_seqlen_q=max(lq, default=0),
            max_seqlen_k=max(lk, default=0),
            num_segments=len(lq),
            head_dim=p["d"],
            num_heads_q=p["hq"],
            num_heads_kv=p["hkv"],
        )
    if case.op in ("moe_route", "moe_experts"):
        ints = {"tokens": p["t"], "num_heads": p["hl"], "num_experts": p["e"], "top_k": p["k"], "hidden": p["d"]}
        if case.op == "moe_experts":
            ints["intermediate"] = p["i"]
        feats = {Feature.DETERMINISTIC} if p.get("deterministic") else set()
        feats |= {Feature.ROUTE_SOFTMAX} if p.get("score_func") == "softmax" else set()
        feats |= {Feature.ROUTE_NO_NORM} if p.get("route_norm") is False else set()
        return Problem(**base, features=frozenset(feats), **ints)
    sizes = p["sizes"]
    return Problem(
        **base,
        out_dtype=p["out_dtype"] or case.dtype,
        tokens=p["shape"][0],
        width=p["shape"][-1],
        num_modalities=1 if sizes is None else len(sizes),
        num_patterns=p["patterns"],
    )


def _in_ranges(cap: Capability, case: Case) -> bool:
    return not any(r.code == ReasonCode.RANGE for r in static_reasons(cap, problem_of(case)))


def _range(cap: Capability, *fields: str) -> tuple[int, int | None]:
    """The intersection of the descriptor's ranges on ``fields`` as ``(lo, hi)``."""
    lo, hi = 0, None
    for r in cap.ranges:
        if r.field in fields:
            lo = max(lo, r.min if r.min is not None else 0)
            hi = r.max if hi is None else (hi if r.max is None else min(hi, r.max))
    return lo, hi


def _clamp(value: int, cap: Capability, *fields: str) -> int:
    lo, hi = _range(cap, *fields)
    value = max(value, lo)
    return value if hi is None else min(value, hi)


def _boundary_lengths(cap: Capability, fields: Iterable[str], max_tokens: int) -> list[int]:
    """Lengths on both sides of every range end and rule threshold on ``fields``."""
    bounds = cap.boundaries()
    out: set[int] = set()
    for f in fields:
        for b in bounds.get(f, ()):
            out.update(v for v in (b - 1, b) if 0 <= v <= max_tokens)
    return sorted(out)


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------
_LAYOUTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "ragged": ((5, 17, 1, 9), (7, 3, 12, 20)),
    "single": ((24,), (24,)),
    "self": ((8, 13), (8, 13)),
    "empty-segments": ((4, 0, 6, 3), (3, 5, 0, 8)),  # an empty query segment and an empty key segment
    "t0": ((0,), (0,)),
}


def _attention_layouts(cap: Capability, max_tokens: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    layouts = dict(_LAYOUTS)
    q_fields = ("max_seqlen_q", "tokens")
    k_fields = ("max_seqlen_k", "tokens_k")
    for n in _boundary_lengths(cap, q_fields, max_tokens):
        layouts[f"lq{n}"] = ((n,), (_clamp(max(n, 1), cap, *k_fields),))
    for n in _boundary_lengths(cap, k_fields, max_tokens):
        layouts[f"lk{n}"] = ((_clamp(max(n, 1), cap, *q_fields),), (n,))
    # Always one case inside the claimed length ranges, however large their minimum.
    lq = _clamp(24, cap, *q_fields)
    lk = _clamp(24, cap, *k_fields)
    layouts.setdefault(f"fit{lq}x{lk}", ((lq,), (lk,)))
    return layouts


def _attention(cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
    feats = cap.features
    head_dims = cap.head_dims or tuple(sorted({_clamp(d, cap, "head_dim") for d in DEFAULT_HEAD_DIMS}))
    hq = _clamp(2, cap, "num_heads_q")
    hkv = _clamp(hq, cap, "num_heads_kv")
    layouts = _attention_layouts(cap, max_tokens)
    lq, lk = layouts["ragged"]

    def params(layout: tuple[tuple[int, ...], tuple[int, ...]], d: int, **over: Any) -> dict[str, Any]:
        base = {
            "seqlens_q": layout[0],
            "seqlens_k": layout[1],
            "hq": hq,
            "hkv": hkv,
            "d": d,
            "softcap": -1.0,
            "sinks": 0,
            "sink_rescale": "fp32",
            "lse": False,
            "deterministic": False,
            "scale": 1.0,
        }
        return base | over

    variants: dict[str, dict[str, Any]] = {"sinks0": {"sinks_empty": True}}  # a [0, Hq] sinks tensor = no sinks
    if Feature.SOFTCAP in feats:
        variants["softcap"] = {"softcap": 2.0, "scale": 3.0}  # larger scores, so that the cap bends them
    if Feature.SINKS in feats:
        variants["sinks1"] = {"sinks": 1}
        variants["sinks2"] = {"sinks": 2}
        variants["sinks1-activation-rescale"] = {"sinks": 1, "sink_rescale": "activation"}
    gqa = {"hq": _clamp(4, cap, "num_heads_q"), "hkv": _clamp(1, cap, "num_heads_kv")}
    if Feature.GQA in feats and gqa["hq"] != gqa["hkv"] and gqa["hq"] % gqa["hkv"] == 0:
        variants["gqa"] = gqa
    if Feature.LSE in feats:
        variants["lse"] = {"lse": True}
    if Feature.DETERMINISTIC in feats:
        variants["deterministic"] = {"deterministic": True}
    combined: dict[str, Any] = {}
    for name, over in variants.items():
        if name not in ("sinks0", "sinks1-activation-rescale"):
            combined |= over
    if len([v for v in variants if v != "sinks0"]) > 1:
        variants["all-features"] = combined

    for dtype in cap.dtypes:
        for d in head_dims:
            yield _case("attention", cap, device, dtype, f"d{d}-ragged", params((lq, lk), d))
        for name, layout in layouts.items():
            if name != "ragged":
                yield _case("attention", cap, device, dtype, f"d{head_dims[0]}-{name}", params(layout, head_dims[0]))
            if combined:
                yield _case(
                    "attention",
                    cap,
                    device,
                    dtype,
                    f"d{head_dims[0]}-{name}-all-features",
                    params(layout, head_dims[0], **combined),
                )
        for name, over in variants.items():
            if name != "all-features":
                yield _case(
                    "attention",
                    cap,
                    device,
                    dtype,
                    f"d{head_dims[-1]}-ragged-{name}",
                    params((lq, lk), head_dims[-1], **over),
                )


# ---------------------------------------------------------------------------------------------
# MoE
# ---------------------------------------------------------------------------------------------
def _moe(cap: Capability, device: str, op: OpName) -> Iterator[Case]:
    e = _clamp(8, cap, "num_experts")
    base: dict[str, Any] = {
        "t": _clamp(37 if op == "moe_route" else 29, cap, "tokens"),
        "hl": _clamp(2, cap, "num_heads"),
        "e": e,
        "k": min(_clamp(3, cap, "top_k"), e),
        "d": _clamp(32, cap, "hidden"),
        "bias": True,
        "pattern": "routed",
    }
    if op == "moe_experts":
        base["i"] = _clamp(64, cap, "intermediate")
    variants: dict[str, dict[str, Any]] = {
        "base": {},
        "top1": {"k": 1},
        "top-all": {"k": e},
        "one-head": {"hl": 1},
        "t0": {"t": 0},
        "wide": {"e": 16, "k": 6},
    }
    if op == "moe_route":
        variants["no-bias"] = {"bias": False}
        if Feature.ROUTE_SOFTMAX in cap.features:
            variants["softmax"] = {"score_func": "softmax"}
        if Feature.ROUTE_NO_NORM in cap.features:
            variants["no-norm"] = {"route_norm": False}
            if Feature.ROUTE_SOFTMAX in cap.features:
                variants["softmax-no-norm"] = {"score_func": "softmax", "route_norm": False}
    else:
        variants["hot-expert"] = {"pattern": "hot"}  # every token picks the same experts; the others stay empty
        if Feature.DETERMINISTIC in cap.features:
            variants["deterministic"] = {"deterministic": True}
    for dtype in cap.dtypes:
        for name, over in variants.items():
            params = base | over
            params["k"] = min(params["k"], params["e"])
            yield _case(op, cap, device, dtype, name, params)


# ---------------------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------------------
_NORM_LAYOUTS: dict[str, dict[str, Any]] = {
    "2d": {"shape": (33, 64), "sizes": None, "patterns": 1},
    "patterns": {"shape": (9, 3, 48), "sizes": None, "patterns": 3},
    "modalities-empty-group": {"shape": (12, 64), "sizes": (5, 0, 7), "patterns": 1},
    "modalities-patterns-4d": {"shape": (10, 2, 3, 32), "sizes": (4, 6), "patterns": 3},
    "flat-weight": {"shape": (11, 2, 40), "sizes": (6, 5), "patterns": 2, "flat": True},
    "broadcast-pattern": {"shape": (7, 4, 32), "sizes": (3, 4), "patterns": 1},
    "t0": {"shape": (0, 64), "sizes": (0,), "patterns": 1},
}


def _rmsnorm(cap: Capability, device: str) -> Iterator[Case]:
    for dtype in cap.dtypes:
        outs: list[str | None] = [None]
        claimed = cap.out_dtypes if cap.out_dtypes is not None else ("float32",)
        outs += [o for o in claimed if o != dtype]
        if cap.out_dtypes is not None and dtype not in cap.out_dtypes:
            outs.remove(None)  # the default out dtype (x's) is not claimed
        for name, layout in _NORM_LAYOUTS.items():
            for out in outs:
                params = {"flat": False, "eps": 1e-6, "weight_dtype": "float32", "out_dtype": out} | layout
                label = name + ("" if out is None else f"-out-{out}")
                yield _case("rmsnorm", cap, device, dtype, label, params)
        yield _case(
            "rmsnorm",
            cap,
            device,
            dtype,
            "weight-in-x-dtype-eps1e-5",
            {"flat": False, "eps": 1e-5, "weight_dtype": dtype, "out_dtype": None} | _NORM_LAYOUTS["2d"],
        )


# ---------------------------------------------------------------------------------------------
def generate_cases(cap: Capability, device: str, *, max_tokens: int = DEFAULT_MAX_TOKENS) -> list[Case]:
    """Every case of ``cap`` on ``device`` inside the claimed ranges, in a stable order, no duplicates."""
    if cap.op == "attention":
        cases: Iterable[Case] = _attention(cap, device, max_tokens)
    elif cap.op in ("moe_route", "moe_experts"):
        cases = _moe(cap, device, cap.op)
    else:
        cases = _rmsnorm(cap, device)
    seen: dict[str, Case] = {}
    for c in cases:
        if c.id not in seen and _in_ranges(cap, c):
            seen[c.id] = c
    return list(seen.values())
