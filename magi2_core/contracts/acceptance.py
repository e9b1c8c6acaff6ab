"""Numerical acceptance rules per operator and dtype (operators.md §2.9, §3.8, §4.4).

Each rule compares a provider's output with the reference provider's output on the same inputs and
returns an :class:`Acceptance` (ok, the metric that decided, a readable detail). Tests, the
conformance kit, ``magi2 check`` and shadow verification all use these functions, so a tolerance is
stated once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "ATTENTION_TOL",
    "Acceptance",
    "accept_attention",
    "accept_lse",
    "accept_moe_experts",
    "accept_moe_route",
    "accept_rmsnorm",
    "allclose",
    "rel_l2",
    "within_ulps",
]

# (rtol, atol) for attention outputs by activation dtype: upstream MATE/FA3 parity tolerances.
ATTENTION_TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (2e-5, 2e-5),
    torch.bfloat16: (1e-2, 1.5e-2),
    torch.float16: (2e-2, 3e-3),
}
LSE_TOL: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (3e-3, 3e-3),
    torch.float16: (3e-3, 3e-3),
}


@dataclass(frozen=True)
class Acceptance:
    ok: bool
    metric: str
    detail: str

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'} {self.metric}: {self.detail}"


def _shape_mismatch(actual: torch.Tensor, expected: torch.Tensor) -> Acceptance | None:
    if actual.shape != expected.shape:
        return Acceptance(False, "shape", f"got {list(actual.shape)}, expected {list(expected.shape)}")
    if actual.dtype != expected.dtype:
        return Acceptance(False, "dtype", f"got {actual.dtype}, expected {expected.dtype}")
    return None


def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    a, e = actual.double().cpu(), expected.double().cpu()
    denom = float(torch.linalg.vector_norm(e))
    num = float(torch.linalg.vector_norm(a - e))
    return num / denom if denom > 0 else num


def allclose(actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float, what: str) -> Acceptance:
    """``|a - e| <= atol + rtol·|e|`` elementwise; NaN only where the reference has NaN."""
    bad = _shape_mismatch(actual, expected)
    if bad is not None:
        return bad
    a, e = actual.double().cpu(), expected.double().cpu()
    close = torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    n_bad = int((~close).sum())
    if n_bad == 0:
        err = float((a - e).abs().nan_to_num(0.0).max()) if a.numel() else 0.0
        return Acceptance(True, what, f"max |Δ| {err:.3g} within rtol={rtol:g}, atol={atol:g}")
    where = torch.nonzero(~close)[0].tolist()
    return Acceptance(
        False,
        what,
        f"{n_bad}/{a.numel()} outside rtol={rtol:g}, atol={atol:g}; first at {where}: "
        f"got {a[tuple(where)].item():.6g}, expected {e[tuple(where)].item():.6g}",
    )


def within_ulps(actual: torch.Tensor, expected: torch.Tensor, ulps: float = 1.0) -> Acceptance:
    """``|a - e| <=`` ``ulps`` local ULPs of ``e`` in its own dtype: the larger gap to its two neighbours."""
    bad = _shape_mismatch(actual, expected)
    if bad is not None:
        return bad
    e = expected.cpu()
    up = torch.nextafter(e, torch.full_like(e, float("inf"))).double() - e.double()
    down = e.double() - torch.nextafter(e, torch.full_like(e, float("-inf"))).double()
    ulp = torch.maximum(up.nan_to_num(0.0, posinf=0.0), down.nan_to_num(0.0, posinf=0.0))
    a64, e64 = actual.cpu().double(), e.double()
    diff = (a64 - e64).abs()
    same = (a64 == e64) | (a64.isnan() & e64.isnan())
    close = same | (diff <= ulps * ulp)
    n_bad = int((~close).sum())
    if n_bad == 0:
        return Acceptance(True, f"<= {ulps:g} ulp", f"{a64.numel()} values")
    where = torch.nonzero(~close)[0].tolist()
    return Acceptance(
        False,
        f"<= {ulps:g} ulp",
        f"{n_bad}/{a64.numel()} values off; first at {where}: "
        f"got {a64[tuple(where)].item():.8g}, expected {e64[tuple(where)].item():.8g}",
    )


def accept_attention(actual: torch.Tensor, expected: torch.Tensor) -> Acceptance:
    rtol, atol = ATTENTION_TOL[expected.dtype]
    return allclose(actual, expected, rtol, atol, "attention output")


def accept_lse(actual: torch.Tensor, expected: torch.Tensor, activation_dtype: torch.dtype) -> Acceptance:
    rtol, atol = LSE_TOL[activation_dtype]
    return allclose(actual, expected, rtol, atol, "attention lse")


def accept_moe_route(
    probs: torch.Tensor, idx: torch.Tensor, ref_probs: torch.Tensor, ref_idx: torch.Tensor
) -> Acceptance:
    if not torch.equal(idx.cpu().long(), ref_idx.cpu().long()):
        n = int((idx.cpu().long() != ref_idx.cpu().long()).sum())
        return Acceptance(False, "moe_route ids", f"{n} expert ids differ from the reference selection")
    return allclose(probs, ref_probs, 1e-5, 1e-6, "moe_route probs")


def accept_moe_experts(actual: torch.Tensor, expected: torch.Tensor, intermediate: int) -> Acceptance:
    """Upstream #7206: finite, rel-L2 < 1e-3, elementwise rtol 2e-2 and atol 0.5 (I >= 1024) or 4e-2."""
    bad = _shape_mismatch(actual, expected)
    if bad is not None:
        return bad
    if not bool(torch.isfinite(actual).all()):
        return Acceptance(False, "moe_experts finite", "output has NaN/Inf")
    r = rel_l2(actual, expected)
    if r >= 1e-3:
        return Acceptance(False, "moe_experts rel-L2", f"{r:.3g} >= 1e-3")
    close = allclose(actual, expected, 2e-2, 0.5 if intermediate >= 1024 else 4e-2, "moe_experts")
    return Acceptance(close.ok, "moe_experts", f"rel-L2 {r:.3g}; {close.detail}")


def accept_rmsnorm(actual: torch.Tensor, expected: torch.Tensor) -> Acceptance:
    """FP32: rtol = atol = 1e-6; FP16/BF16: within one local ULP of the reference (#7286)."""
    if expected.dtype == torch.float32:
        return allclose(actual, expected, 1e-6, 1e-6, "rmsnorm fp32")
    return within_ulps(actual, expected, 1.0)
