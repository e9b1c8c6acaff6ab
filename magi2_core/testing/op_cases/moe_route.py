"""The conformance cases of ``moe_route``: the shared MoE sizes, near-ties, the score and norm options
and the non-finite inputs whose routes upstream defines."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from magi2_core.model.capability import Capability
from magi2_core.model.problem import Feature, OpName, Problem
from magi2_core.testing.cases import Call, Case, dtype_of
from magi2_core.testing.op_cases._moe import moe_case_problem, moe_cases, router_inputs
from magi2_core.testing.op_cases.base import OpCases
from magi2_core.testing.route import plant_near_ties
from magi2_core.testing.specials import ROUTE_SPECIALS, route_specials

__all__ = ["CASES"]

OP: OpName = "moe_route"


class MoERouteCases(OpCases):
    op = OP

    def cases(self, cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
        # near-ties: router rows planted to tie exactly, or within and around the contract's gap
        variants: dict[str, dict[str, Any]] = {"no-bias": {"bias": False}, "near-ties": {"near_ties": True}}
        if Feature.ROUTE_SOFTMAX in cap.features:
            variants["softmax"] = {"score_func": "softmax"}
        if Feature.ROUTE_NO_NORM in cap.features:
            variants["no-norm"] = {"route_norm": False}
            if Feature.ROUTE_SOFTMAX in cap.features:
                variants["softmax-no-norm"] = {"score_func": "softmax", "route_norm": False}
        for kind in ROUTE_SPECIALS:  # non-finite inputs whose routes upstream defines
            variants[kind.replace("_", "-")] = {"special": kind}
        return moe_cases(OP, cap, device, tokens=37, extra={}, variants=variants)

    def case_problem(self, case: Case) -> Problem:
        return moe_case_problem(case)

    def build(self, case: Case, g: torch.Generator) -> Call:
        p = case.p
        x, w, bias = router_inputs(g, p, dtype_of(case.dtype))
        if p.get("special"):
            assert bias is not None
            x, bias = route_specials(p["special"], x, bias, top_k=p["k"])
        if p.get("near_ties"):
            w, bias = plant_near_ties(g, w, bias, num_heads=p["hl"])
        options = {"route_norm": p.get("route_norm", True), "score_func": p.get("score_func", "sigmoid")}
        return Call((x, w, bias), {"top_k": p["k"], "route_scale": 4.9, **options})

    def layout(self, call: Call) -> dict[str, tuple[list[int], tuple[torch.dtype, ...]]]:
        x = call.args[0]
        shape = [x.shape[1], x.shape[0], call.kwargs["top_k"]]
        return {"probs": (shape, (torch.float32,)), "idx": (shape, (torch.int64, torch.int32))}

    def invalid_calls(self, dtype: torch.dtype, other: torch.dtype, g: torch.Generator) -> dict[str, Call]:
        x, w, bias = router_inputs(g, {"t": 6, "hl": 2, "e": 4, "d": 8, "bias": True}, dtype)
        assert bias is not None
        return {
            "top_k larger than the experts per head": Call((x, w, bias), {"top_k": 5}),
            "router_weight not FP32": Call((x, w.to(dtype if dtype != torch.float32 else other), bias), {"top_k": 2}),
            "bias of the wrong length": Call((x, w, bias[:-1]), {"top_k": 2}),
        }


CASES = MoERouteCases()
