"""Where the GPU routing time goes, and what the router GEMM could cost instead (H200 measurement).

    python -m benchmarks.route_profile [--out benchmarks/results/route_profile_h200.json]

Production-local shape: x [T, 3, 256] BF16, router [768, 256] FP32, bias [768], top-6, T = 512, 4096,
14601. Each piece is captured in its own CUDA graph and timed with the L2 flushed (benchmarks/_common):

* ``route_triton`` / ``route_reference``: the public op on each provider;
* ``upcast``, ``logits_fp32``, ``sigmoid``, ``select``: the pieces of the Triton provider;
* candidate router GEMMs: ``logits_split3_n`` / ``logits_split3_k`` (the FP32 router split exactly
  into three BF16 parts, hi + mid + lo; BF16 x times a BF16 part is exact in FP32, so only the
  accumulation order differs from an FP32 GEMM), and ``logits_tf32`` (not exact: for scale only).

For each candidate: the largest |z - z_fp64| and the number of (head, token) rows whose top-6 ids differ
from the ids of the FP32 GEMM and from the ids of the FP64 logits (same sigmoid + bias + top-k).
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from typing import Any

import torch

import magi2_core as m2
from benchmarks._common import env_record, graphed, stats, time_alternating

HEADS, EXPERTS, D, TOP_K = 3, 256, 256, 6
# (token rows per program, warps) of the selection kernel, tried against its default
SELECT_CONFIGS = ((16, 4), (4, 1), (8, 1), (2, 1), (16, 8), (32, 8), (8, 2), (4, 2), (1, 1))


def split3(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FP32 w = hi + mid + lo exactly, each part BF16 (8 significant bits each, 24 in all)."""
    hi = w.bfloat16()
    r = w - hi.float()
    mid = r.bfloat16()
    lo = (r - mid.float()).bfloat16()
    return hi, mid, lo


def ids_of(z: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(z.float())
    return torch.topk(s + bias.view(HEADS, 1, EXPERTS), TOP_K, dim=-1).indices


def profile(t: int, iters: int) -> dict[str, Any]:
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(t)
    x = torch.randn(t, HEADS, D, device=dev, generator=g).bfloat16()
    router = torch.randn(HEADS * EXPERTS, D, device=dev, generator=g) * D**-0.5
    bias = torch.randn(HEADS * EXPERTS, device=dev, generator=g) * 0.01
    w = router.view(HEADS, EXPERTS, D)
    xp = x.permute(1, 0, 2)  # [Hl, T, d] view
    xf = x.float()
    hi, mid, lo = split3(w)
    w3n = torch.cat([hi, mid, lo], dim=1).transpose(1, 2)  # [Hl, d, 3E]
    w3k = torch.cat([hi, mid, lo], dim=2).transpose(1, 2)  # [Hl, 3d, E]
    scores = torch.sigmoid(torch.bmm(xf.permute(1, 0, 2), w.transpose(1, 2)))

    from magi2_backend_triton.moe_route import select_routes

    def logits_split3_n() -> torch.Tensor:
        p = torch.bmm(xp, w3n, out_dtype=torch.float32).view(HEADS, t, 3, EXPERTS)
        return (p[:, :, 2] + p[:, :, 1]) + p[:, :, 0]

    def logits_split3_k() -> torch.Tensor:
        x3 = xp.repeat(1, 1, 3)  # [Hl, T, 3d]: (x, x, x) against (hi; mid; lo)
        return torch.bmm(x3, w3k, out_dtype=torch.float32)

    def logits_tf32() -> torch.Tensor:
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return torch.bmm(xf.permute(1, 0, 2), w.transpose(1, 2))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False

    fns: dict[str, Callable[[], object]] = {
        "route_triton": lambda: m2.moe_route(x, router, bias, top_k=TOP_K, provider="triton"),
        "route_reference": lambda: m2.moe_route(x, router, bias, top_k=TOP_K, provider="reference"),
        "upcast": lambda: x.float(),
        "logits_fp32": lambda: torch.bmm(xf.permute(1, 0, 2), w.transpose(1, 2)),
        "sigmoid": lambda: torch.sigmoid(scores),
        "select": lambda: select_routes(scores, bias, top_k=TOP_K, route_scale=4.9, route_norm=True),
        **{
            f"select_t{bt}_w{nw}": functools.partial(
                select_routes, scores, bias, top_k=TOP_K, route_scale=4.9, route_norm=True, block_t=bt, num_warps=nw
            )
            for bt, nw in SELECT_CONFIGS
        },
        "logits_split3_n": logits_split3_n,
        "logits_split3_k": logits_split3_k,
        "logits_tf32": logits_tf32,
    }
    times = time_alternating({k: graphed(f) for k, f in fns.items()}, iters, warmup=3)
    z64 = torch.bmm(x.double().permute(1, 0, 2), w.double().transpose(1, 2))
    z32 = torch.bmm(xf.permute(1, 0, 2), w.transpose(1, 2))
    ids32, ids64 = ids_of(z32, bias), ids_of(z64, bias)
    accuracy = {}
    for name, z in (("logits_fp32", z32), ("logits_split3_n", logits_split3_n()), ("logits_split3_k", logits_split3_k()),
                    ("logits_tf32", logits_tf32())):  # fmt: skip
        ids = ids_of(z, bias)
        accuracy[name] = {
            "max_abs_err_vs_fp64": float((z.double() - z64).abs().max()),
            "rows_ids_differ_vs_fp32_gemm": int((ids != ids32).any(-1).sum()),
            "rows_ids_differ_vs_fp64": int((ids != ids64).any(-1).sum()),
        }
    ref_p, ref_i = m2.moe_route(x, router, bias, top_k=TOP_K, route_scale=4.9, provider="reference")
    selection = {}
    for name, fn in fns.items():
        if name.startswith("select") or name == "route_triton":
            p, i = fn()  # type: ignore[misc]
            selection[name] = {"ids_equal_reference": bool(torch.equal(i, ref_i)),
                               "probs_max_abs_diff": float((p - ref_p).abs().max())}  # fmt: skip
    return {"tokens": t, "ms": {k: stats(v) for k, v in times.items()}, "accuracy": accuracy, "selection": selection}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/route_profile_h200.json")
    ap.add_argument("--iters", type=int, default=60)
    args = ap.parse_args()
    rows = [profile(t, args.iters) for t in (512, 4096, 14601)]
    for r in rows:
        line = "  ".join(f"{k} {v['p50']:.4f}" for k, v in r["ms"].items())
        print(f"T={r['tokens']}: {line}")
        for k, v in {**r["accuracy"], **r["selection"]}.items():
            print(f"    {k}: {v}")
    with open(args.out, "w") as f:
        json.dump({"benchmark": "route_profile", **env_record(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
