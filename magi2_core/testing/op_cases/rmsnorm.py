"""The conformance cases of ``rmsnorm``: 2-D and pattern layouts, empty modality groups, a flat weight,
every claimed out dtype, the empty results."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from magi2_core.model.capability import Capability
from magi2_core.model.problem import OpName, Problem
from magi2_core.testing.cases import Call, Case, dtype_of, make_case, randn
from magi2_core.testing.op_cases.base import OpCases, out_dtypes

__all__ = ["CASES"]

OP: OpName = "rmsnorm"
_NORM_LAYOUTS: dict[str, dict[str, Any]] = {
    "2d": {"shape": (33, 64), "sizes": None, "patterns": 1},
    "patterns": {"shape": (9, 3, 48), "sizes": None, "patterns": 3},
    "modalities-empty-group": {"shape": (12, 64), "sizes": (5, 0, 7), "patterns": 1},
    "modalities-patterns-4d": {"shape": (10, 2, 3, 32), "sizes": (4, 6), "patterns": 3},
    "flat-weight": {"shape": (11, 2, 40), "sizes": (6, 5), "patterns": 2, "flat": True},
    "broadcast-pattern": {"shape": (7, 4, 32), "sizes": (3, 4), "patterns": 1},
    "t0": {"shape": (0, 64), "sizes": (0,), "patterns": 1},
    "width0": {"shape": (6, 3, 0), "sizes": (2, 4), "patterns": 3},  # the empty result, as upstream
    "t0-width0": {"shape": (0, 0), "sizes": None, "patterns": 1},
}


class RMSNormCases(OpCases):
    op = OP

    def cases(self, cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
        for dtype in cap.dtypes:
            outs = out_dtypes(cap, dtype)
            for name, layout in _NORM_LAYOUTS.items():
                for out in outs:
                    params = {"flat": False, "eps": 1e-6, "weight_dtype": "float32", "out_dtype": out} | layout
                    label = name + ("" if out is None else f"-out-{out}")
                    yield make_case(OP, cap, device, dtype, label, params)
            params = {"flat": False, "eps": 1e-5, "weight_dtype": dtype, "out_dtype": None} | _NORM_LAYOUTS["2d"]
            yield make_case(OP, cap, device, dtype, "weight-in-x-dtype-eps1e-5", params)

    def case_problem(self, case: Case) -> Problem:
        p = case.p
        sizes = p["sizes"]
        return Problem(
            op=OP,
            device_type=case.device,
            dtype=case.dtype,
            out_dtype=p["out_dtype"] or case.dtype,
            tokens=p["shape"][0],
            width=p["shape"][-1],
            num_modalities=1 if sizes is None else len(sizes),
            num_patterns=p["patterns"],
        )

    def build(self, case: Case, g: torch.Generator) -> Call:
        p = case.p
        shape = tuple(p["shape"])
        # Per-token scales spread over two decades so that the normalisation is not the identity.
        spread = torch.exp(torch.randn((shape[0],) + (1,) * (len(shape) - 1), generator=g, dtype=torch.float64))
        x = (torch.randn(shape, generator=g, dtype=torch.float64) * spread).to(dtype_of(case.dtype))
        m = 1 if p["sizes"] is None else len(p["sizes"])
        weight = randn(g, (m, p["patterns"], shape[-1]), dtype_of(p["weight_dtype"]), 0.2)
        if p["flat"]:
            weight = weight.reshape(-1)
        out = None if p["out_dtype"] is None else dtype_of(p["out_dtype"])
        sizes = None if p["sizes"] is None else list(p["sizes"])
        return Call((x, weight), {"eps": p["eps"], "modality_sizes": sizes, "out_dtype": out})

    def layout(self, call: Call) -> dict[str, tuple[list[int], tuple[torch.dtype, ...]]]:
        x = call.args[0]
        return {"y": (list(x.shape), (call.kwargs["out_dtype"] or x.dtype,))}

    def invalid_calls(self, dtype: torch.dtype, other: torch.dtype, g: torch.Generator) -> dict[str, Call]:
        x = randn(g, (8, 16), dtype)
        weight = randn(g, (2, 1, 16), torch.float32)
        return {
            "modality sizes not summing to the tokens": Call((x, weight), {"modality_sizes": [3, 4]}),
            "weight of the wrong width": Call((x, weight[..., :8]), {"modality_sizes": [3, 5]}),
            "modality sizes as a tensor": Call((x, weight), {"modality_sizes": torch.tensor([3, 5])}),
        }


CASES = RMSNormCases()
