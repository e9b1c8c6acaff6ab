"""The conformance cases of ``mhc_mix``: four and other stream counts, coefficients in the streams'
dtype (as ``mhc_pre`` returns them by default) and in FP32, non-finite streams, and no tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from magi2_core.model.capability import Capability
from magi2_core.model.problem import OpName, Problem
from magi2_core.testing.cases import Call, Case, clamp, dtype_of, make_case, randn
from magi2_core.testing.op_cases.base import OpCases
from magi2_core.testing.op_cases.mhc_pre import mhc_streams

__all__ = ["CASES"]

OP: OpName = "mhc_mix"
_LAYOUTS: dict[str, dict[str, Any]] = {
    "n4": {"tokens": 21, "streams": 4, "width": 80},
    "n3": {"tokens": 9, "streams": 3, "width": 40},
    "n1": {"tokens": 5, "streams": 1, "width": 16},
    "nonfinite-streams": {"tokens": 6, "streams": 4, "width": 32, "nonfinite": True},
    "t0": {"tokens": 0, "streams": 4, "width": 32},
}


class MHCMixCases(OpCases):
    op = OP

    def cases(self, cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
        for dtype in cap.dtypes:
            for name, layout in _LAYOUTS.items():
                n = clamp(layout["streams"], cap, "num_streams")
                label = name if n == layout["streams"] else f"{name}-as-n{n}"
                for coef in dict.fromkeys((dtype, "float32")):
                    params = {"nonfinite": False, "coef_dtype": coef} | layout | {"streams": n}
                    yield make_case(OP, cap, device, dtype, f"{label}-coef-{coef}", params)

    def case_problem(self, case: Case) -> Problem:
        p = case.p
        return Problem(
            op=OP,
            device_type=case.device,
            dtype=case.dtype,
            tokens=p["tokens"],
            num_streams=p["streams"],
            hidden=p["width"],
        )

    def build(self, case: Case, g: torch.Generator) -> Call:
        p = case.p
        t, n, d = p["tokens"], p["streams"], p["width"]
        dt, cd = dtype_of(case.dtype), dtype_of(p["coef_dtype"])
        x = mhc_streams(g, t, n, d, dt)
        if p["nonfinite"]:  # token 1: -inf in one stream; token 3: a NaN
            x[1, n - 1, 2] = float("-inf")
            x[3, 0, 5] = float("nan")
        y = randn(g, (t, d), dt)
        post = (2 * torch.sigmoid(torch.randn((t, n), generator=g, dtype=torch.float64))).to(cd)
        res = torch.softmax(torch.randn((t, n, n), generator=g, dtype=torch.float64), dim=-1).to(cd)
        return Call((x, y, post, res), {})

    def layout(self, call: Call) -> dict[str, tuple[list[int], tuple[torch.dtype, ...]]]:
        x = call.args[0]
        return {"streams": (list(x.shape), (x.dtype,))}

    def invalid_calls(self, dtype: torch.dtype, other: torch.dtype, g: torch.Generator) -> dict[str, Call]:
        x = randn(g, (8, 4, 16), dtype)
        y = randn(g, (8, 16), dtype)
        post, res = randn(g, (8, 4), torch.float32), randn(g, (8, 4, 4), torch.float32)
        return {
            "a branch output of another dtype": Call((x, y.to(other), post, res), {}),
            "a branch output of another width": Call((x, y[:, :8], post, res), {}),
            "a residual matrix of another stream count": Call((x, y, post, res[:, :3, :3]), {}),
            "post of another token count": Call((x, y, post[:7], res), {}),
        }


CASES = MHCMixCases()
