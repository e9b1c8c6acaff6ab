"""The conformance cases of ``attention``: ragged, empty and boundary layouts, every claimed feature,
upstream's sink kinds in each sink path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from magi2_core.model.capability import Capability
from magi2_core.model.problem import Feature, OpName, Problem
from magi2_core.testing.cases import Call, Case, boundary_lengths, clamp, dtype_of, make_case, prefix_sums, randn
from magi2_core.testing.op_cases.base import OpCases
from magi2_core.testing.specials import SINK_KINDS, sink_logits

__all__ = ["CASES", "DEFAULT_HEAD_DIMS"]

OP: OpName = "attention"
_LAYOUTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "ragged": ((5, 17, 1, 9), (7, 3, 12, 20)),
    "single": ((24,), (24,)),
    "self": ((8, 13), (8, 13)),
    "empty-segments": ((4, 0, 6, 3), (3, 5, 0, 8)),  # an empty query segment and an empty key segment
    "t0": ((0,), (0,)),
}
DEFAULT_HEAD_DIMS = (32, 64)


def _layouts(cap: Capability, max_tokens: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    layouts = dict(_LAYOUTS)
    q_fields = ("max_seqlen_q", "tokens")
    k_fields = ("max_seqlen_k", "tokens_k")
    for n in boundary_lengths(cap, q_fields, max_tokens):
        layouts[f"lq{n}"] = ((n,), (clamp(max(n, 1), cap, *k_fields),))
    for n in boundary_lengths(cap, k_fields, max_tokens):
        layouts[f"lk{n}"] = ((clamp(max(n, 1), cap, *q_fields),), (n,))
    # Always one case inside the claimed length ranges, however large their minimum.
    lq = clamp(24, cap, *q_fields)
    lk = clamp(24, cap, *k_fields)
    layouts.setdefault(f"fit{lq}x{lk}", ((lq,), (lk,)))
    return layouts


class AttentionCases(OpCases):
    op = OP

    def cases(self, cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
        feats = cap.features
        head_dims = cap.head_dims or tuple(sorted({clamp(d, cap, "head_dim") for d in DEFAULT_HEAD_DIMS}))
        hq = clamp(2, cap, "num_heads_q")
        hkv = clamp(hq, cap, "num_heads_kv")
        layouts = _layouts(cap, max_tokens)
        lq, lk = layouts["ragged"]

        def params(layout: tuple[tuple[int, ...], tuple[int, ...]], d: int, **over: Any) -> dict[str, Any]:
            base = {
                "seqlens_q": layout[0],
                "seqlens_k": layout[1],
                "hq": hq,
                "hkv": hkv,
                "d": d,
                "softcap": -1.0,
                "sinks": 0,
                "sink_rescale": "fp32",
                "lse": False,
                "deterministic": False,
                "scale": 1.0,
            }
            return base | over

        variants: dict[str, dict[str, Any]] = {"sinks0": {"sinks_empty": True}}  # [0, Hq] sinks = no sinks
        if Feature.SOFTCAP in feats:
            variants["softcap"] = {"softcap": 2.0, "scale": 3.0}  # larger scores, so that the cap bends them
        if Feature.SINKS in feats:
            variants["sinks1"] = {"sinks": 1}
            variants["sinks2"] = {"sinks": 2}
            variants["sinks1-activation-rescale"] = {"sinks": 1, "sink_rescale": "activation"}
            # upstream's other sink kinds, in the three sink paths a provider may take: one row in FP32
            # without an LSE (where a native sink may serve), two rows with the LSE, the activation rescale
            lse = Feature.LSE in feats
            for kind in SINK_KINDS[1:]:
                label = kind.replace("_", "-")
                variants[f"sinks1-{label}"] = {"sinks": 1, "sink_kind": kind}
                variants[f"sinks2-{label}" + "-lse" * lse] = {"sinks": 2, "sink_kind": kind, "lse": lse}
                variants[f"sinks1-{label}-activation-rescale"] = {
                    "sinks": 1,
                    "sink_kind": kind,
                    "lse": lse,
                    "sink_rescale": "activation",
                }
        gqa = {"hq": clamp(4, cap, "num_heads_q"), "hkv": clamp(1, cap, "num_heads_kv")}
        if Feature.GQA in feats and gqa["hq"] != gqa["hkv"] and gqa["hq"] % gqa["hkv"] == 0:
            variants["gqa"] = gqa
        if Feature.LSE in feats:
            variants["lse"] = {"lse": True}
        if Feature.DETERMINISTIC in feats:
            variants["deterministic"] = {"deterministic": True}
        combined: dict[str, Any] = {}
        for name, over in variants.items():
            if name not in ("sinks0", "sinks1-activation-rescale") and "sink_kind" not in over:
                combined |= over
        if len([v for v in variants if v != "sinks0"]) > 1:
            variants["all-features"] = combined

        for dtype in cap.dtypes:
            for d in head_dims:
                yield make_case(OP, cap, device, dtype, f"d{d}-ragged", params((lq, lk), d))
            for name, layout in layouts.items():
                if name != "ragged":
                    yield make_case(OP, cap, device, dtype, f"d{head_dims[0]}-{name}", params(layout, head_dims[0]))
                if combined:
                    yield make_case(
                        OP,
                        cap,
                        device,
                        dtype,
                        f"d{head_dims[0]}-{name}-all-features",
                        params(layout, head_dims[0], **combined),
                    )
            for name, over in variants.items():
                if name != "all-features":
                    yield make_case(
                        OP,
                        cap,
                        device,
                        dtype,
                        f"d{head_dims[-1]}-ragged-{name}",
                        params((lq, lk), head_dims[-1], **over),
                    )

    def case_problem(self, case: Case) -> Problem:
        p = case.p
        lq, lk = p["seqlens_q"], p["seqlens_k"]
        feats = {Feature.SOFTCAP} if p["softcap"] > 0 else set()
        feats |= {Feature.SINKS} if p["sinks"] > 0 else set()
        feats |= {Feature.GQA} if p["hq"] != p["hkv"] else set()
        feats |= {Feature.LSE} if p["lse"] else set()
        feats |= {Feature.DETERMINISTIC} if p["deterministic"] else set()
        return Problem(
            op=OP,
            device_type=case.device,
            dtype=case.dtype,
            features=frozenset(feats),
            tokens=sum(lq),
            tokens_k=sum(lk),
            max_seqlen_q=max(lq, default=0),
            max_seqlen_k=max(lk, default=0),
            num_segments=len(lq),
            head_dim=p["d"],
            num_heads_q=p["hq"],
            num_heads_kv=p["hkv"],
        )

    def build(self, case: Case, g: torch.Generator) -> Call:
        p = case.p
        dt = dtype_of(case.dtype)
        tq, tk = sum(p["seqlens_q"]), sum(p["seqlens_k"])
        q = randn(g, (tq, p["hq"], p["d"]), dt, p["scale"])
        k = randn(g, (tk, p["hkv"], p["d"]), dt, p["scale"])
        v = randn(g, (tk, p["hkv"], p["d"]), dt)
        sinks: torch.Tensor | None = None
        if p["sinks"]:
            sinks = sink_logits(p.get("sink_kind", "normal"), p["sinks"], p["hq"], g)
        elif p.get("sinks_empty"):
            sinks = torch.empty((0, p["hq"]), dtype=torch.float32)
        kwargs: dict[str, Any] = {
            "softcap": p["softcap"],
            "sinks": sinks,
            "sink_rescale": p["sink_rescale"],
            "deterministic": p["deterministic"],
            "return_lse": p["lse"],
        }
        return Call((q, k, v, prefix_sums(p["seqlens_q"]), prefix_sums(p["seqlens_k"])), kwargs)

    def layout(self, call: Call) -> dict[str, tuple[list[int], tuple[torch.dtype, ...]]]:
        q = call.args[0]
        out: dict[str, tuple[list[int], tuple[torch.dtype, ...]]] = {"o": (list(q.shape), (q.dtype,))}
        if call.kwargs["return_lse"]:
            out["lse"] = ([q.shape[1], q.shape[0]], (torch.float32,))
        return out

    def invalid_calls(self, dtype: torch.dtype, other: torch.dtype, g: torch.Generator) -> dict[str, Call]:
        q, k, v = (randn(g, (10, 2, 16), dtype) for _ in range(3))
        cu = prefix_sums((4, 6))
        return {
            "cu_seqlens_q ends before q's tokens": Call((q, k, v, prefix_sums((4, 5)), cu), {}),
            "cu_seqlens_k decreasing": Call((q, k, v, cu, torch.tensor([0, 7, 5, 10], dtype=torch.int32)), {}),
            "k dtype differs from q": Call((q, k.to(other), v, cu, cu), {}),
            "sinks of the wrong head count": Call((q, k, v, cu, cu), {"sinks": torch.randn(1, 3, generator=g)}),
            "q heads not a multiple of kv heads": Call((randn(g, (10, 3, 16), dtype), k, v, cu, cu), {}),
        }


CASES = AttentionCases()
