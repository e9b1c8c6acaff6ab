"""The conformance cases of ``mhc_pre``: the release's four streams and other stream counts, empty
modality groups, both norm-weight layouts, every claimed coefficient dtype, Sinkhorn settings, tokens
with non-finite streams, and no tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from magi2_core.model.capability import Capability
from magi2_core.model.problem import OpName, Problem
from magi2_core.testing.cases import Call, Case, clamp, dtype_of, make_case, randn
from magi2_core.testing.op_cases.base import OpCases, out_dtypes

__all__ = ["CASES", "mhc_parameters", "mhc_streams"]

OP: OpName = "mhc_pre"
_LAYOUTS: dict[str, dict[str, Any]] = {
    "n4": {"tokens": 23, "streams": 4, "width": 48, "sizes": None},
    "n4-modalities-empty-group": {"tokens": 17, "streams": 4, "width": 32, "sizes": (6, 0, 11)},
    "n4-weight-2d": {"tokens": 9, "streams": 4, "width": 32, "sizes": (4, 5), "weight_2d": True},
    "n3": {"tokens": 11, "streams": 3, "width": 40, "sizes": None},
    "n1": {"tokens": 5, "streams": 1, "width": 16, "sizes": None},
    "sinkhorn-3-iterations-eps1e-3": {
        "tokens": 7,
        "streams": 4,
        "width": 16,
        "sizes": None,
        "iterations": 3,
        "sinkhorn_eps": 1e-3,
    },
    "sinkhorn-0-iterations": {"tokens": 7, "streams": 4, "width": 16, "sizes": None, "iterations": 0},
    "nonfinite-streams": {"tokens": 8, "streams": 4, "width": 32, "sizes": (3, 5), "nonfinite": True},
    "t0": {"tokens": 0, "streams": 4, "width": 32, "sizes": (0,)},
}


def mhc_streams(g: torch.Generator, t: int, n: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    """``[T, n, D]`` streams whose per-token scales spread over two decades (the norm is not the identity)."""
    spread = torch.exp(torch.randn((t, 1, 1), generator=g, dtype=torch.float64))
    return (torch.randn((t, n, d), generator=g, dtype=torch.float64) * spread).to(dtype)


def mhc_parameters(g: torch.Generator, m: int, n: int, d: int) -> tuple[torch.Tensor, ...]:
    """FP32 ``(norm_weight [M·n·D], phi, alpha_pre, alpha_post, alpha_res, bias_pre, bias_post, bias_res)``,
    scaled so that the logits move the coefficients through the sigmoid's curved part."""
    f32 = torch.float32
    alphas = (torch.rand((3, 1), generator=g, dtype=torch.float64) + 0.5).to(f32)
    return (
        randn(g, (m * n * d,), f32, 0.2),
        randn(g, (n * d, 2 * n + n * n), f32),
        *alphas,
        randn(g, (n,), f32),
        randn(g, (n,), f32),
        randn(g, (n, n), f32),
    )


class MHCPreCases(OpCases):
    op = OP

    def cases(self, cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
        for dtype in cap.dtypes:
            outs = out_dtypes(cap, dtype)
            for name, layout in _LAYOUTS.items():
                n = clamp(layout["streams"], cap, "num_streams")
                label = name if n == layout["streams"] else f"{name}-as-n{n}"
                for out in outs if name in ("n4", "n4-modalities-empty-group") else outs[:1]:
                    params = (
                        {
                            "iterations": 20,
                            "sinkhorn_eps": 1e-12,
                            "weight_2d": False,
                            "nonfinite": False,
                            "out_dtype": out,
                        }
                        | layout
                        | {"streams": n}
                    )
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
        x = mhc_streams(g, t, n, d, dtype_of(case.dtype))
        if p["nonfinite"]:  # token 0: +inf in one stream; token 4: a NaN; the others finite
            x[0, n - 1, 3] = float("inf")
            x[4, 0, 0] = float("nan")
        params = mhc_parameters(g, m, n, d)
        if p["weight_2d"]:
            params = (params[0].view(m, n * d), *params[1:])
        out = None if p["out_dtype"] is None else dtype_of(p["out_dtype"])
        kwargs = {
            "modality_sizes": sizes,
            "sinkhorn_iterations": p["iterations"],
            "sinkhorn_eps": p["sinkhorn_eps"],
            "out_dtype": out,
        }
        return Call((x, *params), kwargs)

    def layout(self, call: Call) -> dict[str, tuple[list[int], tuple[torch.dtype, ...]]]:
        x = call.args[0]
        t, n, d = x.shape
        od = call.kwargs["out_dtype"] or x.dtype
        return {"branch_input": ([t, d], (x.dtype,)), "post": ([t, n], (od,)), "residual": ([t, n, n], (od,))}

    def invalid_calls(self, dtype: torch.dtype, other: torch.dtype, g: torch.Generator) -> dict[str, Call]:
        x = mhc_streams(g, 8, 4, 16, dtype)
        params = mhc_parameters(g, 2, 4, 16)
        return {
            "modality sizes not summing to the tokens": Call((x, *params), {"modality_sizes": [3, 4]}),
            "a norm weight for another modality count": Call((x, *params), {"modality_sizes": [8]}),
            "phi of another width": Call((x, params[0], params[1][:, :8], *params[2:]), {"modality_sizes": [3, 5]}),
            "a low-precision phi": Call(
                (x, params[0], params[1].to(other if other != torch.float32 else dtype), *params[2:]),
                {"modality_sizes": [3, 5]},
            ),
            "streams of rank 2": Call((x[:, 0], *params), {"modality_sizes": [3, 5]}),
        }


CASES = MHCPreCases()
