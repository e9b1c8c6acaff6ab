"""Independent float64 oracles for the four MAGI-2 operators (operators.md §2.2-2.3, §3.2-3.4, §4.1).

These restate the math of docs/operators.md directly, in float64, with explicit per-segment / per-head /
per-route loops and nothing imported from the backends or from ``magi2_core``: a bug shared by the
reference backend and these oracles would have to be written twice, in two different shapes.
Where a contract fixes a low-precision rounding (the MoE schedule, a low-precision RMSNorm weight),
the oracle rounds at exactly that point and nowhere else, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "AttentionResult",
    "MakeTensor",
    "attention",
    "bf16_round",
    "moe_experts",
    "moe_route",
    "rmsnorm",
    "sink_kind_violations",
    "sink_scale",
    "swiglu7",
    "ulps_off",
]

F64 = torch.float64
# the signature of the `make` fixture (tests/conftest.py): shape, dtype, *, scale, contiguous
MakeTensor = Callable[..., torch.Tensor]


def bf16_round(t: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Round to ``dtype`` (round-to-nearest-even, as torch casts) and come back to float64."""
    return t.to(dtype).to(F64)


# ---------------------------------------------------------------------------------------------
# attention (operators.md §2.2): sinks as extra denominator logits, softcap on the scaled scores only;
# a -inf sink adds nothing, a +inf sink makes its head's output 0 and its LSE +inf (the limit)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionResult:
    o: torch.Tensor  # [Tq, Hq, D] float64
    lse: torch.Tensor  # [Hq, Tq] float64, natural log, including the sinks
    lse_no_sinks: torch.Tensor  # [Hq, Tq] float64, the keys only (what a flash kernel returns)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | Sequence[int],
    cu_seqlens_k: torch.Tensor | Sequence[int],
    *,
    softmax_scale: float | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> AttentionResult:
    tq, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    bq = [int(c) for c in cu_seqlens_q]
    bk = [int(c) for c in cu_seqlens_k]
    o = torch.zeros(tq, hq, d, dtype=F64)
    lse = torch.full((hq, tq), float("-inf"), dtype=F64)
    lse_keys = torch.full((hq, tq), float("-inf"), dtype=F64)
    q64, k64, v64 = q.detach().cpu().to(F64), k.detach().cpu().to(F64), v.detach().cpu().to(F64)
    sink64 = None if sinks is None or sinks.numel() == 0 else sinks.detach().cpu().to(F64)
    for b in range(len(bq) - 1):
        rows = slice(bq[b], bq[b + 1])
        cols = slice(bk[b], bk[b + 1])
        n_rows = bq[b + 1] - bq[b]
        if n_rows == 0:
            continue
        for h in range(hq):
            kv = h // group  # repeat-interleave grouping: q heads [kv·g, (kv+1)·g) share kv head kv
            s = (q64[rows, h, :] @ k64[cols, kv, :].T) * scale  # [Lq, Lk]
            if softcap > 0:
                s = softcap * torch.tanh(s / softcap)
            if s.shape[1] > 0:
                ms = s.max(dim=1, keepdim=True).values
                lse_keys[h, rows] = (ms + torch.log(torch.exp(s - ms).sum(dim=1, keepdim=True))).squeeze(1)
            logits = s
            if sink64 is not None:  # raw (uncapped) sink logits join every row's denominator
                sink_h = sink64[:, h]
                if bool(torch.isposinf(sink_h).any()):
                    # A +inf sink takes all the mass: o = 0 and L = +inf, the limit, which upstream's sink
                    # correction gives too (its packed CPU oracle's softmax computes inf - inf: NaN).
                    lse[h, rows] = math.inf
                    continue
                sink_h = sink_h[~torch.isneginf(sink_h)]  # exp(-inf) = 0: a -inf sink adds nothing
                logits = torch.cat([s, sink_h.expand(n_rows, -1)], dim=1)
            if logits.shape[1] == 0:
                continue  # no keys and no sinks: o = 0, lse = -inf
            m = logits.max(dim=1, keepdim=True).values
            e = torch.exp(logits - m)
            z = e.sum(dim=1, keepdim=True)
            p_keys = e[:, : s.shape[1]] / z
            o[rows, h, :] = p_keys @ v64[cols, kv, :]
            lse[h, rows] = (m + torch.log(z)).squeeze(1)
    return AttentionResult(o, lse, lse_keys)


def sink_scale(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """The spec's sigmoid form of the sink rescale, ``sigmoid(L - logsumexp(sinks))``, in float64.

    ``lse`` is ``[H, T]``; returns ``[H, T]``. Only valid where everything is finite (the
    non-finite rules are tested separately against their stated values).
    """
    s = sinks.to(F64)
    m = s.max(dim=0).values
    ls = m + torch.log(torch.exp(s - m).sum(dim=0))
    return 1.0 / (1.0 + torch.exp(-(lse.to(F64) - ls[:, None])))


def sink_kind_violations(
    o: torch.Tensor,
    lse: torch.Tensor | None,
    sinks: torch.Tensor,
    plain_o: torch.Tensor,
    plain_lse: torch.Tensor | None,
    *,
    exact: bool = True,
) -> list[str]:
    """What breaks the rules for infinite sink mass, per head ``h`` of ``o [T, H, D]`` / ``lse [H, T]``:
    ``logsumexp(sinks[:, h]) = +inf`` -> output exactly 0 and LSE ``+inf``; ``-inf`` (every sink of the
    head ``-inf``) -> the call without sinks (``plain_o``, ``plain_lse``): bit for bit where the sinks
    are applied by the LSE correction (its scale is exactly 1), within BF16 rounding (``exact=False``)
    where a kernel takes them natively and so runs another code path."""
    mass = torch.logsumexp(sinks.detach().cpu().double(), dim=0)
    o, plain_o = o.detach().cpu(), plain_o.detach().cpu()

    def same(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
        return torch.equal(a, b) if exact else torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)

    bad = []
    for h in range(o.shape[1]):
        if mass[h] == math.inf:
            if not bool((o[:, h] == 0).all()):
                bad.append(f"head {h} (+inf sink): output not 0")
            if lse is not None and not bool((lse[h].cpu() == math.inf).all()):
                bad.append(f"head {h} (+inf sink): LSE not +inf")
        elif mass[h] == -math.inf:
            if not same(o[:, h], plain_o[:, h], 1e-2):
                bad.append(f"head {h} (-inf sinks only): output differs from the call without sinks")
            if lse is not None and plain_lse is not None and not same(lse[h].cpu(), plain_lse[h].cpu(), 3e-3):
                bad.append(f"head {h} (-inf sinks only): LSE differs from the call without sinks")
    return bad


# ---------------------------------------------------------------------------------------------
# MoE routing (operators.md §3.2)
# ---------------------------------------------------------------------------------------------
def moe_route(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    top_k: int,
    route_scale: float,
    route_norm: bool = True,
    score_func: Literal["sigmoid", "softmax"] = "sigmoid",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs [Hl, T, K] float64, ids [Hl, T, K] int64)``; ties break toward the lower expert id, NaN
    ranks first and ``-inf`` last (a ``-inf`` bias is picked only when a head has too few other experts)."""
    t, hl, _ = x.shape
    e = router_weight.shape[0] // hl
    probs = torch.zeros(hl, t, top_k, dtype=F64)
    ids = torch.zeros(hl, t, top_k, dtype=torch.int64)
    x64 = x.detach().cpu().to(F64)
    w64 = router_weight.detach().cpu().to(F64)
    b64 = None if bias is None else bias.detach().cpu().to(F64)
    for h in range(hl):
        bank = w64[h * e : (h + 1) * e]  # [E, d], head-major rows
        for tok in range(t):
            z = bank @ x64[tok, h]
            if score_func == "sigmoid":
                sigma = 1.0 / (1.0 + torch.exp(-z))
            else:  # softmax over the head's experts, shifted by the max
                ez = torch.exp(z - z.max())
                sigma = ez / ez.sum()
            sel = sigma if b64 is None else sigma + b64[h * e : (h + 1) * e]
            # descending, NaN first (as torch's sort and topk rank it), equal values in ascending id
            chosen = sorted(range(e), key=lambda j: (not math.isnan(sel[j]), -float(sel[j]), j))[:top_k]
            p = sigma[chosen]  # the unbiased scores: the bias only selects
            if route_norm:
                p = p / max(float(p.abs().sum()), 1e-12)
            probs[h, tok] = p * route_scale
            ids[h, tok] = torch.tensor(chosen, dtype=torch.int64)
    return probs, ids


# ---------------------------------------------------------------------------------------------
# MoE experts (operators.md §3.3-3.4)
# ---------------------------------------------------------------------------------------------
def swiglu7(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``min(g,7)·sigmoid(1.702·min(g,7))·(clamp(u,-7,7)+1)`` in float64."""
    g = torch.minimum(g.to(F64), torch.tensor(7.0, dtype=F64))
    u = torch.clamp(u.to(F64), -7.0, 7.0)
    return g / (1.0 + torch.exp(-1.702 * g)) * (u + 1.0)


Rounding = Literal["none", "schedule", "early"]


def moe_experts(
    x: torch.Tensor,
    probs: torch.Tensor,
    idx: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    *,
    rounding: Rounding = "schedule",
) -> torch.Tensor:
    """``y [T, Hl, d]`` float64.

    ``rounding``: ``"none"`` is the float64 math of the schedule with no rounding at all;
    ``"schedule"`` rounds to x's dtype exactly where operators.md §3.4 does (the SwiGLU7 intermediate, each
    route's weighted output, the final sum); ``"early"`` additionally rounds the gate/up projections
    before the activation (the mistake the reference must not make).
    """
    t, hl, d = x.shape
    kk = probs.shape[2]
    e = w_gate.shape[0] // hl
    low = x.dtype

    def rnd(a: torch.Tensor) -> torch.Tensor:
        return a if rounding == "none" else bf16_round(a, low)

    x64 = x.detach().cpu().to(F64)
    wg, wu, wd = (w.detach().cpu().to(F64) for w in (w_gate, w_up, w_down))
    p64 = probs.detach().cpu().to(F64)
    ids = idx.detach().cpu().long()
    y = torch.zeros(t, hl, d, dtype=F64)
    for h in range(hl):
        for slot in range(kk):
            f = h * e + ids[h, :, slot]  # [T] flat expert of this route slot, one per token
            a = x64[:, h, :].unsqueeze(1)  # [T, 1, d]
            g = torch.bmm(a, wg[f]).squeeze(1)  # [T, I]
            u = torch.bmm(a, wu[f]).squeeze(1)
            if rounding == "early":
                g, u = bf16_round(g, low), bf16_round(u, low)
            mid = rnd(swiglu7(g, u))
            r = torch.bmm(mid.unsqueeze(1), wd[f]).squeeze(1) * p64[h, :, slot, None]  # [T, d]
            y[:, h, :] += rnd(r)
    return y if rounding == "none" else bf16_round(y, low)


# ---------------------------------------------------------------------------------------------
# RMSNorm (operators.md §4.1-4.2)
# ---------------------------------------------------------------------------------------------
def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float = 1e-6,
    modality_sizes: Sequence[int] | None = None,
) -> torch.Tensor:
    """``x·rsqrt(mean(x²)+eps)·(w[m]+1)`` in float64, same shape as x.

    ``weight`` is ``[M, P, D]`` or flat ``[M·P·D]``. A low-precision weight forms ``w + 1`` in its
    own dtype first (the rounding order operators.md §4.1 pins); an FP32 weight's ``w + 1`` is exact here.
    """
    sizes = [x.shape[0]] if modality_sizes is None else [int(s) for s in modality_sizes]
    d = x.shape[-1]
    w = weight.detach().cpu().reshape(len(sizes), -1, d)
    one_plus = (w + 1).to(F64) if w.dtype in (torch.bfloat16, torch.float16) else w.to(F64) + 1.0
    x64 = x.detach().cpu().to(F64)
    out = torch.empty_like(x64)
    start = 0
    for m, n in enumerate(sizes):
        xs = x64[start : start + n]
        ms = (xs * xs).sum(dim=-1, keepdim=True) / d
        normed = xs / torch.sqrt(ms + eps)
        scale = one_plus[m] if x.dim() > 2 else one_plus[m].reshape(d)  # [P, D] broadcasts over heads
        out[start : start + n] = normed * scale
        start += n
    return out


# ---------------------------------------------------------------------------------------------
# comparison helper for the reference's tighter-than-contract promises
# ---------------------------------------------------------------------------------------------
def ulps_off(actual: torch.Tensor, oracle64: torch.Tensor, *, ulps: float = 1.0, atol: float = 0.0) -> str | None:
    """None when ``|actual - round(oracle64)| <= ulps·ulp + atol`` everywhere (NaN matching NaN), else a
    message. The ULP is the larger gap from the rounded oracle value to its two neighbours in
    ``actual``'s dtype; ``atol`` admits the FP32 accumulation floor where a result cancels to ~0."""
    e = oracle64.detach().cpu().to(actual.dtype)
    up = torch.nextafter(e, torch.full_like(e, float("inf"))).to(F64) - e.to(F64)
    down = e.to(F64) - torch.nextafter(e, torch.full_like(e, float("-inf"))).to(F64)
    ulp = torch.maximum(up.nan_to_num(0.0, posinf=0.0), down.nan_to_num(0.0, posinf=0.0))
    a64, e64 = actual.detach().cpu().to(F64), e.to(F64)
    ok = (a64 == e64) | (a64.isnan() & e64.isnan()) | ((a64 - e64).abs() <= ulps * ulp + atol)
    if bool(ok.all()):
        return None
    where = tuple(torch.nonzero(~ok)[0].tolist())
    return (
        f"{int((~ok).sum())}/{ok.numel()} values beyond {ulps:g} ulp + {atol:g}; first at {list(where)}: "
        f"got {a64[where].item():.9g}, oracle {oracle64[where].item():.9g}"
    )
