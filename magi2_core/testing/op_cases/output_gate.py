"""The conformance cases of ``output_gate``: MAGI-2's gather and ``[T, H, 1]`` gate, a ``[T, H]`` gate without
a gather, int32 indices, strided views (a head-sliced x, a gate read from a wider projection), saturating
logits, non-finite inputs, every claimed out dtype, and no tokens."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from magi2_core.model.capability import Capability
from magi2_core.model.problem import OpName, Problem
from magi2_core.testing.cases import Call, Case, dtype_of, make_case, randn
from magi2_core.testing.op_cases.base import OpCases, out_dtypes

__all__ = ["CASES"]

OP: OpName = "output_gate"
_DEFAULTS: dict[str, Any] = {
    "index": "int64",
    "gate_shape": "thx1",
    "strided": False,
    "scale": 2.0,
    "nonfinite": False,
    "gate_dtype": None,
}
_LAYOUTS: dict[str, dict[str, Any]] = {
    "magi2-gather": {"tokens": 37, "heads": 3, "dim": 32},
    "gate-2d-no-index": {"tokens": 19, "heads": 2, "dim": 16, "index": None, "gate_shape": "th"},
    "int32-index": {"tokens": 10, "heads": 4, "dim": 8, "index": "int32"},
    "strided-views": {"tokens": 21, "heads": 2, "dim": 24, "strided": True},
    "saturating-logits": {"tokens": 9, "heads": 3, "dim": 16, "scale": 40.0},
    "fp32-gate": {"tokens": 11, "heads": 2, "dim": 16, "gate_dtype": "float32"},
    "nonfinite": {"tokens": 9, "heads": 2, "dim": 16, "nonfinite": True},
    "odd-head-dim": {"tokens": 7, "heads": 5, "dim": 3},
    "t0": {"tokens": 0, "heads": 2, "dim": 16},
}


class OutputGateCases(OpCases):
    op = OP

    def cases(self, cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
        for dtype in cap.dtypes:
            outs = out_dtypes(cap, dtype)
            for name, layout in _LAYOUTS.items():
                for out in outs:
                    params = _DEFAULTS | {"out_dtype": out} | layout
                    yield make_case(OP, cap, device, dtype, name + ("" if out is None else f"-out-{out}"), params)

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
        )

    def build(self, case: Case, g: torch.Generator) -> Call:
        p = case.p
        t, h, d = p["tokens"], p["heads"], p["dim"]
        dt = dtype_of(case.dtype)
        gdt = dtype_of(p["gate_dtype"] or case.dtype)
        x = randn(g, (t, h, d), dt)
        gate = randn(g, (t, h), gdt, p["scale"])
        if p["strided"]:  # x as heads 1::2 of a wider tensor; the gate as columns of a wider projection
            wide = randn(g, (t, 2 * h, d), dt)
            wide[:, 1::2] = x
            x = wide[:, 1::2]
            proj = randn(g, (t, h + 5), gdt)
            proj[:, 5:] = gate
            gate = proj[:, 5:]
        if p["nonfinite"]:  # NaN and infinities, propagated as IEEE arithmetic has it (no special case)
            x[1, 0, 3] = float("nan")
            x[4, 1, 0] = float("inf")
            gate[2, 1] = float("nan")
            gate[5, 0] = float("-inf")
            gate[6, 1] = float("inf")
        if p["gate_shape"] == "thx1":
            gate = gate.unsqueeze(-1)
        index = None if p["index"] is None else torch.randperm(t, generator=g).to(dtype_of(p["index"]))
        out = None if p["out_dtype"] is None else dtype_of(p["out_dtype"])
        return Call((x, gate), {"index": index, "out_dtype": out})

    def layout(self, call: Call) -> dict[str, tuple[list[int], tuple[torch.dtype, ...]]]:
        x = call.args[0]
        return {"y": (list(x.shape), (call.kwargs["out_dtype"] or x.dtype,))}

    def invalid_calls(self, dtype: torch.dtype, other: torch.dtype, g: torch.Generator) -> dict[str, Call]:
        x = randn(g, (8, 2, 16), dtype)
        gate = randn(g, (8, 2), dtype)
        return {
            "a 2-D x": Call((x[:, 0], gate), {}),
            "a gate of another head count": Call((x, gate[:, :1]), {}),
            "a gate of another token count": Call((x, gate[:7]), {}),
            "a gate with a last dim of 2": Call((x, torch.stack((gate, gate), dim=-1)), {}),
            "an integer gate": Call((x, torch.zeros(8, 2, dtype=torch.int32)), {}),
            "a float index": Call((x, gate), {"index": torch.zeros(8)}),
            "an index of another length": Call((x, gate), {"index": torch.arange(7)}),
            "an integer out dtype": Call((x, gate), {"out_dtype": torch.int32}),
        }


CASES = OutputGateCases()
