"""The conformance cases of ``qk_norm_rope``: MAGI-2's partial rotation (R < D) with three modalities and a
gather, a full rotation, empty modality groups, a strided view of a packed projection, a flat weight,
int32 indices, non-finite inputs, every claimed out dtype, and no tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from magi2_core.model.capability import Capability
from magi2_core.model.problem import OpName, Problem
from magi2_core.testing.cases import Call, Case, dtype_of, make_case, randn
from magi2_core.testing.op_cases.base import OpCases, out_dtypes

__all__ = ["CASES"]

OP: OpName = "qk_norm_rope"
_DEFAULTS: dict[str, Any] = {"sizes": None, "index": "int64", "view": False, "flat": False, "nonfinite": False}
_LAYOUTS: dict[str, dict[str, Any]] = {
    "partial-3-modalities": {"tokens": 37, "heads": 3, "dim": 32, "rotary": 24, "sizes": (20, 5, 12)},
    "full-rotation-no-index": {"tokens": 19, "heads": 2, "dim": 16, "rotary": 16, "index": None},
    "empty-group": {"tokens": 12, "heads": 2, "dim": 24, "rotary": 8, "sizes": (5, 0, 7)},
    "qkv-view": {"tokens": 21, "heads": 2, "dim": 32, "rotary": 24, "sizes": (15, 6), "view": True},
    "flat-weight-int32-index": {"tokens": 10, "heads": 4, "dim": 16, "rotary": 12, "flat": True, "index": "int32"},
    "nonfinite": {"tokens": 9, "heads": 2, "dim": 16, "rotary": 16, "nonfinite": True},
    "rotary-2": {"tokens": 8, "heads": 1, "dim": 8, "rotary": 2},
    "t0": {"tokens": 0, "heads": 2, "dim": 16, "rotary": 16, "sizes": (0,)},
}


class QKNormRopeCases(OpCases):
    op = OP

    def cases(self, cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
        for dtype in cap.dtypes:
            outs = out_dtypes(cap, dtype)
            for name, layout in _LAYOUTS.items():
                for out in outs:
                    params = _DEFAULTS | {"eps": 1e-6, "weight_dtype": "float32", "out_dtype": out} | layout
                    yield make_case(OP, cap, device, dtype, name + ("" if out is None else f"-out-{out}"), params)
            params = _DEFAULTS | {"eps": 1e-5, "weight_dtype": dtype, "out_dtype": None}
            yield make_case(OP, cap, device, dtype, "weight-in-x-dtype-eps1e-5", params | _LAYOUTS["qkv-view"])

    def case_problem(self, case: Case) -> Problem:
        p = case.p
        return Problem(
            op=OP,
            device_type=case.device,
            dtype=case.dtype,
            out_dtype=p["out_dtype"] or case.dtype,
            tokens=p["tokens"],
            num_heads=p["heads"],
            head_dim=p["dim"],
            rotary_dim=p["rotary"],
            num_modalities=1 if p["sizes"] is None else len(p["sizes"]),
        )

    def build(self, case: Case, g: torch.Generator) -> Call:
        p = case.p
        t, h, d, r = p["tokens"], p["heads"], p["dim"], p["rotary"]
        dt = dtype_of(case.dtype)
        # Per-row scales spread over two decades so that the normalisation is not the identity.
        spread = torch.exp(torch.randn((t, h, 1), generator=g, dtype=torch.float64))
        x = (torch.randn((t, h, d), generator=g, dtype=torch.float64) * spread).to(dt)
        if p["view"]:  # q as upstream slices it: the first H·D columns of a wider packed projection
            packed = randn(g, (t, 3 * h * d), dt)
            packed[:, : h * d] = x.reshape(t, h * d)
            x = packed[:, : h * d].view(t, h, d)
        if p["nonfinite"]:  # a NaN and an infinity, propagated as IEEE arithmetic has it (no special case)
            x[1, 0, 3] = float("nan")
            x[4, 1, 0] = float("inf")
        m = 1 if p["sizes"] is None else len(p["sizes"])
        weight = randn(g, (m, d), dtype_of(p["weight_dtype"]), 0.2)
        if p["flat"]:
            weight = weight.reshape(-1)
        angles = 3 * torch.randn((t, r // 2), generator=g, dtype=torch.float64)
        rope = torch.cat((angles.sin(), angles.cos()), dim=-1).float()
        index = None if p["index"] is None else torch.randperm(t, generator=g).to(dtype_of(p["index"]))
        out = None if p["out_dtype"] is None else dtype_of(p["out_dtype"])
        sizes = None if p["sizes"] is None else list(p["sizes"])
        kwargs = {"eps": p["eps"], "modality_sizes": sizes, "index": index, "out_dtype": out}
        return Call((x, weight, rope), kwargs)

    def layout(self, call: Call) -> dict[str, tuple[list[int], tuple[torch.dtype, ...]]]:
        x = call.args[0]
        return {"y": (list(x.shape), (call.kwargs["out_dtype"] or x.dtype,))}

    def invalid_calls(self, dtype: torch.dtype, other: torch.dtype, g: torch.Generator) -> dict[str, Call]:
        x = randn(g, (8, 2, 16), dtype)
        weight = randn(g, (2, 16), torch.float32)
        rope = randn(g, (8, 12), torch.float32)
        sizes = {"modality_sizes": [3, 5]}
        return {
            "an odd rotary width": Call((x, weight, rope[:, :11]), sizes),
            "a rotary width above the head dim": Call((x, weight, randn(g, (8, 18), torch.float32)), sizes),
            "rope of another token count": Call((x, weight, rope[:7]), sizes),
            "a weight of the wrong width": Call((x, weight[:, :8], rope), sizes),
            "a float index": Call((x, weight, rope), sizes | {"index": torch.zeros(8)}),
            "an index of another length": Call((x, weight, rope), sizes | {"index": torch.arange(7)}),
            "modality sizes not summing to the tokens": Call((x, weight, rope), {"modality_sizes": [3, 4]}),
        }


CASES = QKNormRopeCases()
