"""What the two MoE specs share: conformance sizes, the router inputs, and the ``explain`` fields."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import torch

from magi2_core.capability import Capability
from magi2_core.ops._spec import ExplainError
from magi2_core.problem import Feature, OpName, Problem
from magi2_core.testing.case import Case, clamp, make_case, randn

__all__ = ["ROUTE_SPECIALS", "RouteSpecial", "moe_case_problem", "moe_cases", "moe_explain", "route_specials",
           "router_inputs"]


def moe_cases(op: OpName, cap: Capability, device: str, *, tokens: int, extra: Mapping[str, Any],
              variants: Mapping[str, Mapping[str, Any]]) -> Iterator[Case]:
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


RouteSpecial = Literal["neg_inf_bias", "exhausted", "pos_inf_bias", "nan_logits"]
ROUTE_SPECIALS: tuple[RouteSpecial, ...] = ("neg_inf_bias", "exhausted", "pos_inf_bias", "nan_logits")


def route_specials(
    kind: RouteSpecial, x: torch.Tensor, bias: torch.Tensor, *, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of router inputs ``x [T, Hl, d]``, ``bias [Hl·E]`` with the non-finite values whose routes
    upstream defines (``torch.topk`` of ``score + bias``); ``E > top_k`` and ``T >= 3`` expected:

    * ``neg_inf_bias``: ``-inf`` on every other expert of every head: never selected while a head has
      ``top_k`` other experts;
    * ``exhausted``: head 0 keeps ``top_k - 1`` finite biases, the others ``-inf``: its last pick is the
      lowest ``-inf`` expert id, and the ids stay distinct;
    * ``pos_inf_bias``: ``+inf`` on experts 1 and E-1 of the last head: picked first (lower id first);
    * ``nan_logits``: token 1 is ``+inf`` everywhere and token 2 has a ``+inf`` and a ``-inf`` feature on
      head 0, so their logits are NaN (``inf - inf``) or ``±inf`` by the signs of the router weights: NaN
      ranks first (in id order), ids stay in range. (Inputs with ``±inf`` rather than NaN, so that an
      unchanged input still compares equal to itself.)
    """
    hl = x.shape[1]
    e = bias.numel() // hl
    x, b = x.clone(), bias.clone().view(hl, e)
    if kind == "neg_inf_bias":
        b[:, 1::2] = -math.inf
    elif kind == "exhausted":
        b[0, top_k - 1 :] = -math.inf
    elif kind == "pos_inf_bias":
        b[-1, [1, e - 1]] = math.inf
    elif kind == "nan_logits":
        x[1] = math.inf
        x[2, 0, 0], x[2, 0, 1] = math.inf, -math.inf
    else:
        raise ValueError(f"unknown route special {kind!r}; one of {', '.join(ROUTE_SPECIALS)}")
    return x, b.view(-1)


def moe_explain(opts: Mapping[str, Any], features: set[Feature]) -> dict[str, Any]:
    if opts["deterministic"]:
        features.add(Feature.DETERMINISTIC)
    if opts["top_k"] > opts["experts"]:
        raise ExplainError(f"--top-k {opts['top_k']} exceeds --experts {opts['experts']} "
                           "(routes pick distinct experts)")
    tokens = opts["tokens"]
    return dict(tokens=tokens if tokens is not None else 4096, num_heads=opts["moe_heads"],
                num_experts=opts["experts"], top_k=opts["top_k"], hidden=opts["hidden"])
