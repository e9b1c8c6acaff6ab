"""The conformance cases of ``moe_experts``: the shared MoE sizes, a hot expert (the others empty) and
the deterministic variant."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from magi2_core.model.capability import Capability
from magi2_core.model.problem import Feature, OpName, Problem
from magi2_core.testing.cases import Call, Case, clamp, dtype_of, randn
from magi2_core.testing.op_cases._moe import moe_case_problem, moe_cases, router_inputs
from magi2_core.testing.op_cases.base import OpCases

__all__ = ["CASES"]

OP: OpName = "moe_experts"


class MoEExpertsCases(OpCases):
    op = OP

    def cases(self, cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
        variants: dict[str, dict[str, Any]] = {"hot-expert": {"pattern": "hot"}}  # other experts stay empty
        if Feature.DETERMINISTIC in cap.features:
            variants["deterministic"] = {"deterministic": True}
        return moe_cases(OP, cap, device, tokens=29, extra={"i": clamp(64, cap, "intermediate")}, variants=variants)

    def case_problem(self, case: Case) -> Problem:
        return moe_case_problem(case)

    def build(self, case: Case, g: torch.Generator) -> Call:
        p = case.p
        dt = dtype_of(case.dtype)
        t, hl, e, k, d, i = p["t"], p["hl"], p["e"], p["k"], p["d"], p["i"]
        x, w, bias = router_inputs(g, p, dt)
        # Routing as the model does it (distinct experts per token), computed exactly in FP64.
        logits = torch.einsum("thd,hed->hte", x.double(), w.double().view(hl, e, d))
        scores = torch.sigmoid(logits)
        select = scores if bias is None else scores + bias.double().view(hl, 1, e)
        if p["pattern"] == "hot":
            idx = torch.arange(k, dtype=torch.int64).expand(hl, t, k).contiguous()
        else:
            idx = torch.topk(select, k, dim=-1).indices
        probs = torch.gather(scores, -1, idx)
        probs = (probs / probs.sum(-1, keepdim=True).clamp_min(1e-12) * 4.9).float()
        w_gate = randn(g, (hl * e, d, i), dt, 1.0 / math.sqrt(d))
        w_up = randn(g, (hl * e, d, i), dt, 1.0 / math.sqrt(d))
        w_down = randn(g, (hl * e, i, d), dt, 1.0 / math.sqrt(i))
        kwargs: dict[str, Any] = {"deterministic": True} if p.get("deterministic") else {}
        return Call((x, probs, idx, w_gate, w_up, w_down), kwargs)

    def layout(self, call: Call) -> dict[str, tuple[list[int], tuple[torch.dtype, ...]]]:
        x = call.args[0]
        return {"y": (list(x.shape), (x.dtype,))}

    def invalid_calls(self, dtype: torch.dtype, other: torch.dtype, g: torch.Generator) -> dict[str, Call]:
        x, _, _ = router_inputs(g, {"t": 6, "hl": 2, "e": 4, "d": 8, "bias": True}, dtype)
        probs = torch.rand(2, 6, 2, generator=g)
        idx = torch.randint(0, 4, (2, 6, 2), generator=g)
        wg, wu = randn(g, (8, 8, 16), dtype), randn(g, (8, 8, 16), dtype)
        wd = randn(g, (8, 16, 8), dtype)
        return {
            "expert id out of range": Call((x, probs, idx + 4, wg, wu, wd), {}),
            "w_down of the wrong shape": Call((x, probs, idx, wg, wu, wd[:, :8]), {}),
            "weights in another dtype": Call((x, probs, idx, wg.to(other), wu, wd), {}),
        }


CASES = MoEExpertsCases()
