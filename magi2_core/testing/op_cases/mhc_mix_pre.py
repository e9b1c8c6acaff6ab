"""The conformance cases of ``mhc_mix_pre``: ``mhc_mix``'s inputs followed by ``mhc_pre``'s parameters,
over the release's four streams and other stream counts, empty modality groups, both norm-weight
layouts, every claimed coefficient dtype, non-finite streams, and no tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from magi2_core.capability import Capability
from magi2_core.problem import OpName, Problem
from magi2_core.testing.cases import Call, Case, clamp, dtype_of, make_case, randn
from magi2_core.testing.op_cases.base import OpCases, out_dtypes
from magi2_core.testing.op_cases.mhc_pre import mhc_parameters, mhc_streams

__all__ = ["CASES"]

OP: OpName = "mhc_mix_pre"
_LAYOUTS: dict[str, dict[str, Any]] = {
    "n4": {"tokens": 23, "streams": 4, "width": 48, "sizes": None},
    "n4-modalities-empty-group": {"tokens": 17, "streams": 4, "width": 32, "sizes": (6, 0, 11)},
    "n4-weight-2d": {"tokens": 9, "streams": 4, "width": 32, "sizes": (4, 5), "weight_2d": True},
    "n3": {"tokens": 11, "streams": 3, "width": 40, "sizes": None},
    "n1": {"tokens": 5, "streams": 1, "width": 16, "sizes": None},
    "nonfinite-streams": {"tokens": 8, "streams": 4, "width": 32, "sizes": (3, 5), "nonfinite": True},
    "t0": {"tokens": 0, "streams": 4, "width": 32, "sizes": (0,)},
}


class MHCMixPreCases(OpCases):
    op = OP

    def cases(self, cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
        for dtype in cap.dtypes:
            outs = out_dtypes(cap, dtype)
            for name, layout in _LAYOUTS.items():
                n = clamp(layout["streams"], cap, "num_streams")
                label = name if n == layout["streams"] else f"{name}-as-n{n}"
                for out in outs if name in ("n4", "n4-modalities-empty-group") else outs[:1]:
                    # the incoming coefficients as the previous mhc_pre returned them (its out dtype)
                    params = {"weight_2d": False, "nonfinite": False, "out_dtype": out} | layout | {"streams": n}
                    yield make_case(OP, cap, device, dtype, label + ("" if out is None else f"-out-{out}"), params)

    def case_problem(self, case: Case) -> Problem:
        p = case.p
        return Problem(
            op=OP,
            device_type=case.device,
            dtype=case.dtype,
            out_dtype=p["out_dtype"] or case.dtype,
            tokens=p["tokens"],
            num_streams=p["streams"],
            hidden=p["width"],
            num_modalities=1 if p["sizes"] is None else len(p["sizes"]),
        )

    def build(self, case: Case, g: torch.Generator) -> Call:
        p = case.p
        t, n, d = p["tokens"], p["streams"], p["width"]
        sizes = None if p["sizes"] is None else list(p["sizes"])
        m = 1 if sizes is None else len(sizes)
        dt = dtype_of(case.dtype)
        out = None if p["out_dtype"] is None else dtype_of(p["out_dtype"])
        coef = out or dt
        x = mhc_streams(g, t, n, d, dt)
        if p["nonfinite"]:  # token 0: +inf in one stream; token 4: a NaN; the others finite
            x[0, n - 1, 3] = float("inf")
            x[4, 0, 0] = float("nan")
        y = randn(g, (t, d), dt)
        post = (2 * torch.sigmoid(torch.randn((t, n), generator=g, dtype=torch.float64))).to(coef)
        res = torch.softmax(torch.randn((t, n, n), generator=g, dtype=torch.float64), dim=-1).to(coef)
        params = mhc_parameters(g, m, n, d)
        if p["weight_2d"]:
            params = (params[0].view(m, n * d), *params[1:])
        kwargs = {"modality_sizes": sizes, "out_dtype": out}
        return Call((x, y, post, res, *params), kwargs)

    def layout(self, call: Call) -> dict[str, tuple[list[int], tuple[torch.dtype, ...]]]:
        x = call.args[0]
        t, n, d = x.shape
        od = call.kwargs["out_dtype"] or x.dtype
        return {
            "streams": ([t, n, d], (x.dtype,)),
            "branch_input": ([t, d], (x.dtype,)),
            "post": ([t, n], (od,)),
            "residual": ([t, n, n], (od,)),
        }

    def invalid_calls(self, dtype: torch.dtype, other: torch.dtype, g: torch.Generator) -> dict[str, Call]:
        x = mhc_streams(g, 8, 4, 16, dtype)
        y = randn(g, (8, 16), dtype)
        post, res = randn(g, (8, 4), torch.float32), randn(g, (8, 4, 4), torch.float32)
        params = mhc_parameters(g, 2, 4, 16)
        sizes = {"modality_sizes": [3, 5]}
        return {
            "a branch output of another dtype": Call((x, y.to(other), post, res, *params), sizes),
            "a residual matrix of another stream count": Call((x, y, post, res[:, :3, :3], *params), sizes),
            "modality sizes not summing to the tokens": Call((x, y, post, res, *params), {"modality_sizes": [3, 4]}),
            "phi of another width": Call((x, y, post, res, params[0], params[1][:, :8], *params[2:]), sizes),
        }


CASES = MHCMixPreCases()
