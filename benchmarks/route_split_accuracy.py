"""Which tensor-core scheme gives FP32-accurate router logits? An emulation on the CPU against float64.

    python -m benchmarks.route_split_accuracy [--rows 3000] [--out route_split_accuracy_cpu.json]

Router logits z = x · w (x BF16, w FP32, d = 256, E = 256 experts, top-6, sigmoid + bias), computed
the way a tensor-core kernel would and compared with float64: the largest |z - z64|, the largest
score error, and the routing contract's ids clause (rows, near-tie rows, clear rows whose ids differ
from the float64 truth). The kernel's accumulation is emulated per MMA step of 16 products: each
step's products summed exactly, then added to the FP32 accumulator rounded to nearest (``rn``) or
truncated (``rz``: tensor cores may truncate when they normalise the sum; the pessimistic model).
Steps run in the kernel's order: hidden slices of 64, and within a slice the smallest term first.

Schemes: ``fp32_gemm`` (torch's FP32 GEMM on the CPU, for scale); ``bf16x3`` (w = hi + mid + lo
exactly, split by truncation as the fused router does in registers: :func:`split_bf16x3`; three BF16
dots, one accumulator); ``bf16x3_split`` (the same with x·hi in its own
accumulator: what the fused router does); ``bf16x2`` (hi + mid only); ``tf32x3`` (w split into two
TF32 terms: for a BF16 x the third product of TF32x3 vanishes); ``tf32`` (one TF32 dot). Inputs:
x ~ N(0, s²) with s = 1 and 4, router ~ N(0, 1/d), bias ~ N(0, 0.01²); random, and with planted
near-ties (``magi2_core.testing.route.plant_near_ties``, a twin for every 16th expert).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch

from magi2_core.contracts.acceptance import route_truth, tally_route_ids
from magi2_core.testing.route import plant_near_ties

D, E, K, STEP, SLICE = 256, 256, 6, 16, 64


def _rz(v: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 rounded toward zero."""
    r = v.float()
    return torch.where(r.double().abs() > v.abs(), torch.nextafter(r, torch.zeros_like(r)), r)


def _tf32(v: torch.Tensor) -> torch.Tensor:
    """FP32 -> TF32 (10 explicit significand bits), rounded to nearest."""
    return ((v.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)


def split_bf16x3(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``hi, mid, lo`` FP32 tensors holding BF16 values, ``hi + mid + lo == w`` exactly: ``hi`` the top 16
    bits of ``w``, ``mid`` the top 16 bits of the rest, ``lo`` the rest (the kernel's ``_top_bf16`` twice)."""
    top = -(2**16)  # 0xFFFF0000 as an int32 mask
    hi = (w.contiguous().view(torch.int32) & top).view(torch.float32)
    rest = w - hi
    mid = (rest.view(torch.int32) & top).view(torch.float32)
    lo = rest - mid
    assert torch.equal(lo.bfloat16().float(), lo)  # at most 8 significant bits left: exact in BF16
    return hi, mid, lo


def _mma(x: torch.Tensor, terms: list[list[torch.Tensor]], mode: str) -> torch.Tensor:
    """``sum(x @ t for t in group)`` per accumulator group, MMA step by step, groups added at the end."""
    rnd: Callable[[torch.Tensor], torch.Tensor] = (lambda v: v.float()) if mode == "rn" else _rz
    x64 = x.double()
    accs = [torch.zeros(x.shape[0], E) for _ in terms]
    for s0 in range(0, D, SLICE):
        for a, group in enumerate(terms):
            for t in group:
                t64 = t.double()
                for k in range(s0, s0 + SLICE, STEP):
                    accs[a] = rnd(accs[a].double() + x64[:, k : k + STEP] @ t64[k : k + STEP])
    out = accs[0]
    for acc in accs[1:]:
        out = out + acc
    return out


def schemes(x: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """Logits [R, E] of every scheme; ``w`` is [E, d]."""
    hi, mid, lo = (p.t() for p in split_bf16x3(w))
    wt = w.t().contiguous()
    big = _tf32(wt)
    small = _tf32(wt - big)
    return {
        "fp32_gemm": x.float() @ wt,
        "bf16x3_rn": _mma(x, [[lo, mid, hi]], "rn"),
        "bf16x3_rz": _mma(x, [[lo, mid, hi]], "rz"),
        "bf16x3_split_rz": _mma(x, [[hi], [lo, mid]], "rz"),
        "bf16x2_rn": _mma(x, [[mid, hi]], "rn"),
        "tf32x3_rn": _mma(x, [[small, big]], "rn"),
        "tf32_rn": _mma(x, [[big]], "rn"),
    }


def measure(rows: int, x_scale: float, planted: bool, seed: int) -> dict[str, dict[str, float]]:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, 1, D, generator=g) * x_scale).bfloat16()
    w = torch.randn(E, D, generator=g) / D**0.5
    b = torch.randn(E, generator=g) * 0.01
    if planted:
        w, pb = plant_near_ties(g, w, b, num_heads=1, every=16)
        assert pb is not None
        b = pb
    truth = route_truth(x, w, b, top_k=K, route_scale=4.9, route_norm=True, score_func="sigmoid")
    z64 = x[:, 0].double() @ w.double().t()
    out: dict[str, dict[str, float]] = {}
    for name, z in schemes(x[:, 0], w).items():
        sel = torch.sigmoid(z) + b
        idx = torch.sort(sel, dim=-1, descending=True, stable=True).indices[:, :K]
        tally = tally_route_ids(idx.view(1, rows, K), truth)
        err = (z.double() - z64).abs()
        out[name] = {
            "max_abs_logit_err": float(err.max()),
            "mean_abs_logit_err": float(err.mean()),
            "max_abs_score_err": float((torch.sigmoid(z.double()) - torch.sigmoid(z64)).abs().max()),
            "rows": tally.rows,
            "near_tie_rows": tally.near_tie_rows,
            "clear_rows_wrong": tally.clear_rows_wrong,
            "rows_outside_contract": tally.group_violations + tally.tie_order_violations,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    result = {}
    for x_scale in (1.0, 4.0):
        for planted in (False, True):
            key = f"x_scale={x_scale:g}, {'planted' if planted else 'random'}"
            result[key] = measure(args.rows, x_scale, planted, seed=int(x_scale * 10) + planted)
            for name, m in result[key].items():
                print(
                    f"{key:24s} {name:16s} max|dz| {m['max_abs_logit_err']:.3g}"
                    f"  mean|dz| {m['mean_abs_logit_err']:.3g}"
                    f"  max|ds| {m['max_abs_score_err']:.3g}  near {m['near_tie_rows']}/{m['rows']}"
                    f"  clear wrong {m['clear_rows_wrong']}  outside contract {m['rows_outside_contract']}",
                    flush=True,
                )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"benchmark": "route_split_accuracy", "device": "cpu (emulation)", "rows": args.rows, "result": result},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
