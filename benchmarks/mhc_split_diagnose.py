"""Which part of ``mhc_pre``'s split-BF16 logits kernel (``bf16x3``) goes wrong on some launches.

    python -m benchmarks.mhc_split_diagnose [--json PATH]

The sweep (``benchmarks/mhc_sweep.py``) found ``bf16x3`` launches that fail the contract on a few rows
while others pass. This script takes the logits apart on the GPU, launch by launch, against float64:
the shipped kernel and variants of one diagnostic kernel that each keep one part (the three dots
alone, the sum of squares alone, the sum of squares from a second load of the streams rather than the
dots' operand, the dots into separate accumulators, both), each run three times (bitwise equal or
not: a race shows here), then the logits' time of the shipped kernel and the second-load variants.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from magi2_backend_triton import mhc_pre as kernel

from benchmarks._common import env_record, stats, time_alternating
from benchmarks.mhc import PACK_TOKENS, STREAMS, WIDTH, _sizes
from magi2_core.testing.op_cases.mhc_pre import mhc_parameters, mhc_streams


# MODE 1: dots only (no norm); 2: sum of squares only; 3: sum of squares from a second load;
# 4: three separate accumulators summed at the end; 5: 3 and 4 together.
@triton.jit
def _variant(
    x_ptr,
    p_ptr,
    out_ptr,
    T,
    NL,
    stride_xt,
    eps,
    K: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MODE: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    acc2 = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    acc3 = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    sumsq = tl.zeros((BLOCK_T,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        m = row_ok[:, None] & (ks < K)[None, :]
        xp = x_ptr + rows[:, None] * stride_xt + ks[None, :]
        x = tl.load(xp, mask=m, other=0.0)
        piece = p_ptr + ks[:, None] * BLOCK_N + cols[None, :]
        if MODE != 2:
            hi = tl.load(piece)
            mid = tl.load(piece + K * BLOCK_N)
            lo = tl.load(piece + 2 * K * BLOCK_N)
            if MODE == 4 or MODE == 5:
                acc = tl.dot(x, hi, acc)
                acc2 = tl.dot(x, mid, acc2)
                acc3 = tl.dot(x, lo, acc3)
            else:
                acc = tl.dot(x, lo, acc)
                acc = tl.dot(x, mid, acc)
                acc = tl.dot(x, hi, acc)
        if MODE == 2 or MODE == 4:
            xf = x.to(tl.float32)
            sumsq += tl.sum(xf * xf, axis=1)
        if MODE == 3 or MODE == 5:
            xf = tl.load(xp, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
            sumsq += tl.sum(xf * xf, axis=1)
    if MODE == 2:
        res = tl.zeros((BLOCK_T, BLOCK_N), tl.float32) + sumsq[:, None]
    elif MODE == 1:
        res = acc
    else:
        res = (acc + acc2 + acc3) * tl.math.rsqrt(sumsq / K + eps)[:, None]
    tl.store(out_ptr + rows[:, None] * NL + cols[None, :], res, mask=row_ok[:, None] & (cols < NL)[None, :])


CONFIGS = [
    (64, 128, 4, 3),
    (64, 64, 4, 3),
    (64, 64, 4, 4),
    (128, 64, 8, 4),
    (64, 128, 8, 3),
    (128, 128, 4, 3),
    (64, 128, 4, 1),
    (64, 64, 4, 1),
    (128, 128, 8, 1),
]
MODES = (
    (1, "dots_only"),
    (2, "sumsq_only"),
    (3, "sumsq_second_load"),
    (4, "separate_accumulators"),
    (5, "second_load_separate_accumulators"),
)
REPEATS = 3


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", default="benchmarks/results/mhc_split_diagnose.json")
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    t = PACK_TOKENS
    sizes = _sizes(t)
    x = mhc_streams(g, t, STREAMS, WIDTH, torch.bfloat16).cuda()
    w, phi = (p.cuda() for p in mhc_parameters(g, len(sizes), STREAMS, WIDTH)[:2])
    k, nl = STREAMS * WIDTH, 2 * STREAMS + STREAMS * STREAMS
    flat = x.reshape(t, k)
    bn = max(16, triton.next_power_of_2(nl))
    w = w.view(len(sizes), k)  # [M, n·D], as the provider's launch receives it
    pieces = kernel.split_pieces(w, phi, bn)
    eps = 1e-6
    # float64 truth, per modality: the projection, the sum of squares, the scale |x|·|folded|
    dots, sumsq, scale = [], [], []
    t0 = 0
    for gi, s in enumerate(sizes):
        xs = flat[t0 : t0 + s].double()
        folded = (w[gi].double() + 1.0).view(k, 1) * phi.double()
        dots.append(xs @ folded)
        sumsq.append((xs * xs).sum(1))
        scale.append(xs.abs() @ folded.abs())
        t0 += s
    dot64, ss64, sc64 = torch.cat(dots), torch.cat(sumsq), torch.cat(scale)
    inv = torch.rsqrt(ss64 / k + eps)
    truth = {m: dot64 * inv[:, None] for m in (0, 3, 4, 5)} | {1: dot64, 2: ss64[:, None].expand(t, nl)}
    bound = {m: sc64 * inv[:, None] for m in (0, 3, 4, 5)} | {1: sc64, 2: ss64[:, None].expand(t, nl)}

    def judge(run: Callable[[], torch.Tensor], mode: int) -> dict[str, Any]:
        outs = [run() for _ in range(REPEATS)]
        rel = ((outs[0].double() - truth[mode]).abs() / bound[mode].clamp_min(1e-30)).amax(1)
        bad = (rel > 1e-4).nonzero().flatten()
        return {
            "max_rel": float(rel.max()),
            "rows_off": int(bad.numel()),
            "first_rows": bad[:8].tolist(),
            "bitwise_repeatable": all(torch.equal(outs[0], o) for o in outs[1:]),
        }

    def shipped(cfg: kernel.LogitsConfig) -> torch.Tensor:  # the chunks added and normalised
        parts, sumsq = kernel._split_partials(flat, w, phi, sizes, cfg)
        return parts.sum(0) * torch.rsqrt(sumsq.sum(0) / k + eps)[:, None]

    def variant(bt: int, bk: int, nw: int, ns: int, mode: int) -> torch.Tensor:
        out = torch.empty((t, nl), dtype=torch.float32, device="cuda")
        t0 = 0
        for gi, s in enumerate(sizes):
            _variant[(triton.cdiv(s, bt),)](
                flat[t0 : t0 + s],
                pieces[gi],
                out[t0 : t0 + s],
                s,
                nl,
                flat.stride(0),
                eps,
                K=k,
                BLOCK_T=bt,
                BLOCK_K=bk,
                BLOCK_N=bn,
                MODE=mode,
                num_warps=nw,
                num_stages=ns,
            )
            t0 += s
        return out

    def ieee() -> torch.Tensor:
        out = torch.empty((t, nl), dtype=torch.float32, device="cuda")
        kernel._fp32_logits(flat, w, phi, out, sizes, eps, kernel.LOGITS_FP32)
        return out

    rows = [{"launch": f"ieee default {kernel.LOGITS_FP32}", "shipped": judge(ieee, 0)}]
    fns: dict[str, Callable[[], torch.Tensor]] = {"ieee default": ieee}
    for bt, bk, nw, ns in CONFIGS:
        name = f"t{bt} k{bk} w{nw} s{ns}"
        cfg = kernel.LogitsConfig(block_t=bt, block_k=bk, precision="bf16x3", num_warps=nw, num_stages=ns)
        row: dict[str, Any] = {"launch": name}
        try:
            row["shipped"] = judge(lambda cfg=cfg: shipped(cfg), 0)
            fns[f"{name} shipped"] = lambda cfg=cfg: shipped(cfg)
            for mode, label in MODES:
                run = functools.partial(variant, bt, bk, nw, ns, mode)
                row[label] = judge(run, mode)
                if mode in (3, 5):
                    fns[f"{name} {label}"] = run
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        torch.cuda.synchronize()
        rows.append(row)
        print(json.dumps(row), flush=True)
    times = {k: stats(v)["p50"] for k, v in time_alternating(fns, 10).items()}
    for k, v in sorted(times.items(), key=lambda kv: kv[1]):
        print(f"{k:40s} logits p50 {v:.3f} ms")
    os.makedirs(os.path.dirname(a.json) or ".", exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(
            {
                "benchmark": "mhc_split_diagnose",
                "env": env_record(),
                "tokens": t,
                "repeats": REPEATS,
                "rows": rows,
                "logits_p50_ms": times,
            },
            f,
            indent=2,
        )


if __name__ == "__main__":
    main()
