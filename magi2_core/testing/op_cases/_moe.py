"""What the two MoE ops' conformance cases share: sizes inside the claimed ranges and the router inputs."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from magi2_core.model.capability import Capability
from magi2_core.model.problem import Feature, OpName, Problem
from magi2_core.testing.cases import Case, clamp, make_case, randn

__all__ = ["moe_case_problem", "moe_cases", "router_inputs"]


def moe_cases(
    op: OpName,
    cap: Capability,
    device: str,
    *,
    tokens: int,
    extra: Mapping[str, Any],
    variants: Mapping[str, Mapping[str, Any]],
) -> Iterator[Case]:
    """The cases both MoE ops share (sizes inside the claimed ranges), then the op's own ``variants``."""
    e = clamp(8, cap, "num_experts")
    base: dict[str, Any] = {
        "t": clamp(tokens, cap, "tokens"),
        "hl": clamp(2, cap, "num_heads"),
        "e": e,
        "k": min(clamp(3, cap, "top_k"), e),
        "d": clamp(32, cap, "hidden"),
        "bias": True,
        "pattern": "routed",
    } | dict(extra)
    shared: dict[str, Mapping[str, Any]] = {
        "base": {},
        "top1": {"k": 1},
        "top-all": {"k": e},
        "one-head": {"hl": 1},
        "t0": {"t": 0},
        "wide": {"e": 16, "k": 6},
    }
    for dtype in cap.dtypes:
        for name, over in (shared | dict(variants)).items():
            params = base | dict(over)
            params["k"] = min(params["k"], params["e"])
            yield make_case(op, cap, device, dtype, name, params)


def moe_case_problem(case: Case) -> Problem:
    p = case.p
    ints = {"tokens": p["t"], "num_heads": p["hl"], "num_experts": p["e"], "top_k": p["k"], "hidden": p["d"]}
    if case.op == "moe_experts":
        ints["intermediate"] = p["i"]
    feats = {Feature.DETERMINISTIC} if p.get("deterministic") else set()
    feats |= {Feature.ROUTE_SOFTMAX} if p.get("score_func") == "softmax" else set()
    feats |= {Feature.ROUTE_NO_NORM} if p.get("route_norm") is False else set()
    return Problem(op=case.op, device_type=case.device, dtype=case.dtype, features=frozenset(feats), **ints)


def router_inputs(
    g: torch.Generator, p: Mapping[str, Any], dt: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    x = randn(g, (p["t"], p["hl"], p["d"]), dt)
    w = randn(g, (p["hl"] * p["e"], p["d"]), torch.float32, 1.0 / math.sqrt(p["d"]))
    bias = randn(g, (p["hl"] * p["e"],), torch.float32, 0.1) if p["bias"] else None
    return x, w, bias
