"""Tensors for a :class:`~magi2_core.testing.cases.Case`, and a few deliberately invalid calls.

Inputs are drawn on the CPU from a generator seeded per case and then moved to the case's device, so
a case gives the same numbers on every device and alone (``--magi2-seed`` plus the case id). Values
are fresh normal draws, never zeros; scales keep softmax, SwiGLU clamps and RMS statistics active.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from magi2_core.testing.cases import Case

__all__ = ["Call", "build_call", "dtype_of", "invalid_calls"]


def dtype_of(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}")
    return dt


@dataclass
class Call:
    """Arguments of one public op call (without ``provider=``)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def to(self, device: str) -> Call:
        def move(v: Any) -> Any:
            return v.to(device) if isinstance(v, torch.Tensor) else v

        return Call(tuple(move(a) for a in self.args), {k: move(v) for k, v in self.kwargs.items()})

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        named = [(f"arg{i}", a) for i, a in enumerate(self.args)] + list(self.kwargs.items())
        return [(n, t) for n, t in named if isinstance(t, torch.Tensor)]

    def describe(self, names: tuple[str, ...] = ()) -> str:
        """One line per argument: tensors as dtype and shape, small index tensors with their values."""
        parts = []
        labelled = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(self.args)]
        for name, value in [*labelled, *self.kwargs.items()]:
            if isinstance(value, torch.Tensor):
                text = f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
                if value.dtype in (torch.int32, torch.int64) and value.dim() == 1 and value.numel() <= 16:
                    text += f" = {value.tolist()}"
                parts.append(f"{name}: {text}")
            elif value is not None:
                parts.append(f"{name}={value!r}")
        return ", ".join(parts)


ARG_NAMES: dict[str, tuple[str, ...]] = {
    "attention": ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"),
    "moe_route": ("x", "router_weight", "bias"),
    "moe_experts": ("x", "probs", "idx", "w_gate", "w_up", "w_down"),
    "rmsnorm": ("x", "weight"),
}


def _randn(g: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def _prefix(lengths: tuple[int, ...]) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _attention(case: Case, g: torch.Generator) -> Call:
    p = case.p
    dt = dtype_of(case.dtype)
    tq, tk = sum(p["seqlens_q"]), sum(p["seqlens_k"])
    q = _randn(g, (tq, p["hq"], p["d"]), dt, p["scale"])
    k = _randn(g, (tk, p["hkv"], p["d"]), dt, p["scale"])
    v = _randn(g, (tk, p["hkv"], p["d"]), dt)
    sinks: torch.Tensor | None = None
    if p["sinks"]:
        sinks = _randn(g, (p["sinks"], p["hq"]), torch.float32, 2.0)  # comparable to the score logsumexp
    elif p.get("sinks_empty"):
        sinks = torch.empty((0, p["hq"]), dtype=torch.float32)
    kwargs: dict[str, Any] = {"softcap": p["softcap"], "sinks": sinks, "sink_rescale": p["sink_rescale"],
                              "deterministic": p["deterministic"], "return_lse": p["lse"]}
    return Call((q, k, v, _prefix(p["seqlens_q"]), _prefix(p["seqlens_k"])), kwargs)


def _router(
    g: torch.Generator, p: dict[str, Any], dt: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    x = _randn(g, (p["t"], p["hl"], p["d"]), dt)
    w = _randn(g, (p["hl"] * p["e"], p["d"]), torch.float32, 1.0 / math.sqrt(p["d"]))
    bias = _randn(g, (p["hl"] * p["e"],), torch.float32, 0.1) if p["bias"] else None
    return x, w, bias


def _moe_route(case: Case, g: torch.Generator) -> Call:
    p = case.p
    x, w, bias = _router(g, p, dtype_of(case.dtype))
    options = {"route_norm": p.get("route_norm", True), "score_func": p.get("score_func", "sigmoid")}
    return Call((x, w, bias), {"top_k": p["k"], "route_scale": 4.9, **options})


def _moe_experts(case: Case, g: torch.Generator) -> Call:
    p = case.p
    dt = dtype_of(case.dtype)
    t, hl, e, k, d, i = p["t"], p["hl"], p["e"], p["k"], p["d"], p["i"]
    x, w, bias = _router(g, p, dt)
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
    w_gate = _randn(g, (hl * e, d, i), dt, 1.0 / math.sqrt(d))
    w_up = _randn(g, (hl * e, d, i), dt, 1.0 / math.sqrt(d))
    w_down = _randn(g, (hl * e, i, d), dt, 1.0 / math.sqrt(i))
    kwargs: dict[str, Any] = {"deterministic": True} if p.get("deterministic") else {}
    return Call((x, probs, idx, w_gate, w_up, w_down), kwargs)


def _rmsnorm(case: Case, g: torch.Generator) -> Call:
    p = case.p
    shape = tuple(p["shape"])
    # Per-token scales spread over two decades so that the normalisation is not the identity.
    spread = torch.exp(torch.randn((shape[0],) + (1,) * (len(shape) - 1), generator=g, dtype=torch.float64))
    x = (torch.randn(shape, generator=g, dtype=torch.float64) * spread).to(dtype_of(case.dtype))
    m = 1 if p["sizes"] is None else len(p["sizes"])
    weight = _randn(g, (m, p["patterns"], shape[-1]), dtype_of(p["weight_dtype"]), 0.2)
    if p["flat"]:
        weight = weight.reshape(-1)
    out = None if p["out_dtype"] is None else dtype_of(p["out_dtype"])
    sizes = None if p["sizes"] is None else list(p["sizes"])
    return Call((x, weight), {"eps": p["eps"], "modality_sizes": sizes, "out_dtype": out})


_BUILDERS: dict[str, Callable[[Case, torch.Generator], Call]] = {
    "attention": _attention, "moe_route": _moe_route, "moe_experts": _moe_experts, "rmsnorm": _rmsnorm,
}


def build_call(case: Case, seed: int) -> Call:
    """The case's arguments, on the case's device."""
    g = torch.Generator().manual_seed(seed)
    return _BUILDERS[case.op](case, g).to(case.device)


def invalid_calls(op: str, dtype: str, device: str, seed: int) -> dict[str, Call]:
    """Calls that the op contract must reject with an input error, by what is wrong with them."""
    g = torch.Generator().manual_seed(seed)
    dt = dtype_of(dtype)
    other = torch.float16 if dt != torch.float16 else torch.bfloat16
    out: dict[str, Call] = {}
    if op == "attention":
        q, k, v = (_randn(g, (10, 2, 16), dt) for _ in range(3))
        cu = _prefix((4, 6))
        out["cu_seqlens_q ends before q's tokens"] = Call((q, k, v, _prefix((4, 5)), cu), {})
        out["cu_seqlens_k decreasing"] = Call((q, k, v, cu, torch.tensor([0, 7, 5, 10], dtype=torch.int32)), {})
        out["k dtype differs from q"] = Call((q, k.to(other), v, cu, cu), {})
        out["sinks of the wrong head count"] = Call((q, k, v, cu, cu), {"sinks": torch.randn(1, 3, generator=g)})
        out["q heads not a multiple of kv heads"] = Call((_randn(g, (10, 3, 16), dt), k, v, cu, cu), {})
    elif op in ("moe_route", "moe_experts"):
        case_p = {"t": 6, "hl": 2, "e": 4, "d": 8, "bias": True}
        x, w, bias = _router(g, case_p, dt)
        if op == "moe_route":
            out["top_k larger than the experts per head"] = Call((x, w, bias), {"top_k": 5})
            out["router_weight not FP32"] = Call((x, w.to(dt if dt != torch.float32 else other), bias), {"top_k": 2})
            out["bias of the wrong length"] = Call((x, w, bias[:-1]), {"top_k": 2})  # type: ignore[index]
        else:
            probs = torch.rand(2, 6, 2, generator=g)
            idx = torch.randint(0, 4, (2, 6, 2), generator=g)
            wg, wu = _randn(g, (8, 8, 16), dt), _randn(g, (8, 8, 16), dt)
            wd = _randn(g, (8, 16, 8), dt)
            out["expert id out of range"] = Call((x, probs, idx + 4, wg, wu, wd), {})
            out["w_down of the wrong shape"] = Call((x, probs, idx, wg, wu, wd[:, :8]), {})
            out["weights in another dtype"] = Call((x, probs, idx, wg.to(other), wu, wd), {})
    else:
        x = _randn(g, (8, 16), dt)
        weight = _randn(g, (2, 1, 16), torch.float32)
        out["modality sizes not summing to the tokens"] = Call((x, weight), {"modality_sizes": [3, 4]})
        out["weight of the wrong width"] = Call((x, weight[..., :8]), {"modality_sizes": [3, 5]})
        out["modality sizes as a tensor"] = Call((x, weight), {"modality_sizes": torch.tensor([3, 5])})
    return {name: call.to(device) for name, call in out.items()}
