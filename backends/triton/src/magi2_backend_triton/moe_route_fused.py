"""The ``triton_fused`` provider of ``moe_route``: the whole routing call in one kernel per head group.

One program routes ``BLOCK_T`` tokens of one head: the router GEMM on tensor cores, sigmoid or
softmax, the bias (selection only), the top-k in descending order with equal values in ascending
expert id, the gather of the unbiased scores, the L1 normalisation and ``route_scale``. The logits
live in the program's accumulator registers and are never written to memory.

FP32-accurate logits from BF16 tensor-core dots ("BF16x3"). The kernel reads the FP32 router weight and
splits it exactly, in registers, into three BF16 planes, ``w = hi + mid + lo`` (truncation: ``hi`` is
the top 16 bits, ``mid`` the top 16 bits of the rest, ``lo`` the rest, at most 8 significant bits; exact
for ``|w| >= 2**-110``). A BF16 activation times a BF16 plane is exact
in FP32, so ``x·lo + x·mid + x·hi`` summed in FP32 is the FP32 GEMM up to summation order. ``x·hi``
has its own accumulator (``split_acc``): tensor cores may truncate when they add into the
accumulator, and keeping the small terms apart keeps that error at the FP32 GEMM's level (the
CPU emulation in ``benchmarks/route_split_accuracy.py``). FP16 and FP32 activations are split the
same way (into 2 and 3 BF16 terms) and every product whose order is below ``2**-24`` is kept, so
they too get FP32-accurate logits on tensor cores (5 and 6 dots instead of 3).

No planes are kept in memory: a derived copy of the router would go stale after writes that bypass
the version counter and would outlive the layer's storage across layer-wise offload, for at most 7%
of the route's time (docs/moe-notes.md, "the fused router").

Selection. The selection scores become int32 keys of the same order (``-0.0`` folded into ``+0.0``,
every NaN into the one positive NaN, which ranks above ``+inf`` as in torch's sort); each of the
``top_k`` steps takes the row's largest key, then the lowest expert id holding it, and knocks that
expert out with a key below every real one (so a ``-inf`` bias is chosen only once the row has
nothing else left).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from magi2_backend_triton.interpret import interpreting
from magi2_backend_triton.providers import device_reasons
from magi2_core.contracts.moe import ScoreFunc
from magi2_core.problem import Problem
from magi2_core.resolution import Reason

__all__ = ["CANDIDATES", "DEFAULTS", "SHARED_BUDGET", "RouteConfig", "TritonFusedMoERoute", "default_config", "fused_route",
           "triton_fused_moe_route"]


class RouteConfig(NamedTuple):
    """One launch configuration: tokens per program, hidden slice per step, warps, pipeline stages, and
    whether ``x·hi`` has its own accumulator (twice the accumulator registers, FP32-GEMM-level error)."""

    block_t: int
    block_d: int
    num_warps: int
    num_stages: int
    split_acc: bool = True

    @property
    def name(self) -> str:
        return f"t{self.block_t}_d{self.block_d}_w{self.num_warps}_s{self.num_stages}" + ("" if self.split_acc else "_1acc")

    def shared_bytes(self, block_e: int = 256) -> int:
        """Shared memory: per pipeline stage an x slice and the FP32 weight slice, and the three BF16
        planes the dots read (formed in registers, staged once per step)."""
        return (self.num_stages * (self.block_t * self.block_d * 2 + self.block_d * block_e * 4)
                + 3 * self.block_d * block_e * 2)


# What one program may take of the H200's 227 KiB of shared memory per block, the rest left to the
# reductions' scratch: every candidate fits it at E = 256 (a test checks).
SHARED_BUDGET = 220 * 1024

# What benchmarks/route_profile.py times, at E = 256 (BLOCK_E = 256 logits per token row). Registers per
# thread per [BLOCK_T, 256] FP32 tile: BLOCK_T * 256 / (32 * num_warps); the GEMM holds two tiles
# (split_acc), the selection two (scores and keys): 64 rows want 8 warps, 128 rows 16. Shared memory:
# the FP32 weight slice is BLOCK_D * 256 * 4 bytes per stage (32 KiB at BLOCK_D = 32), so BLOCK_D = 64 does
# not fit with two stages.
CANDIDATES: tuple[RouteConfig, ...] = (
    RouteConfig(16, 32, 4, 3),
    RouteConfig(32, 32, 4, 3),
    RouteConfig(64, 16, 8, 4),
    RouteConfig(64, 32, 4, 3),
    RouteConfig(64, 32, 8, 3),
    RouteConfig(128, 32, 8, 3),
    RouteConfig(128, 32, 16, 3),
    RouteConfig(64, 32, 8, 3, split_acc=False),
    RouteConfig(128, 32, 16, 3, split_acc=False),
)

# The default, by local token count: (largest T served, config), the last row for every larger T.
# Measured on one H200 (route_fused_h200.json at 4556481, graph p50): t16 0.0175 ms at T = 512 x 3 heads
# (t32 0.0223); t32_d32_w4 the fastest at 4096 and 14601 x 3 heads and 4096 x 12 (0.046 / 0.137 / 0.149 ms);
# larger token blocks spill their two [T, 256] accumulators (t64_d32_w4 0.50 ms at 14601).
DEFAULTS: tuple[tuple[int | None, RouteConfig], ...] = (
    (1024, RouteConfig(16, 32, 4, 3)),
    (None, RouteConfig(32, 32, 4, 3)),
)

# The interpreter pays per program, not per warp: a bigger token block keeps the CPU tests fast.
_INTERPRETER_BLOCK_T = 32
# Activations split into this many BF16 terms: BF16 is one already; FP16 has 11 significant bits, FP32 24.
_X_TERMS = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}
# Below every real key: the order-mapped -inf is -2**31 + 2**23 - 1.
_REMOVED = tl.constexpr(-(2**31))


def default_config(tokens: int) -> RouteConfig:
    for limit, cfg in DEFAULTS:
        if limit is None or tokens <= limit:
            return cfg
    raise AssertionError("DEFAULTS ends with an open row")


@triton.jit
def _top_bf16(v):
    """The BF16 holding FP32 ``v``'s top 16 bits (``v`` truncated to 8 significant bits), and the exact
    FP32 rest ``v - that``. Bit operations only: the same planes on the GPU and in the interpreter."""
    bits = v.to(tl.uint32, bitcast=True)
    top = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return top, v - ((bits >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr):
    # The interpreter multiplies raw BF16 bits in tl.dot: FP32 operands there (BF16 products are exact).
    if UPCAST:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        out = tl.dot(a, b, acc)
    return out


@triton.jit(do_not_specialize=["n_tok"])
def _route_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    probs_ptr,
    idx_ptr,
    n_tok,
    stride_xt,
    stride_xh,
    route_scale,
    E: tl.constexpr,
    D: tl.constexpr,
    K: tl.constexpr,
    X_TERMS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SOFTMAX: tl.constexpr,
    NORM: tl.constexpr,
    SPLIT_ACC: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    EVEN_D: tl.constexpr,
    WIDE_W: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    head = tl.program_id(1).to(tl.int64)
    toks = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_ok = toks < n_tok
    cols = tl.arange(0, BLOCK_E)
    col_ok = cols < E
    dd = tl.arange(0, BLOCK_D)
    w_rows = tl.program_id(1) * E + cols  # each expert's router row
    if WIDE_W:  # the weight past 2**31 elements: int64 offsets (int32 is cheaper on every weight tile)
        w_rows = w_rows.to(tl.int64)
    w_rows = w_rows * D
    x_rows = x_ptr + toks * stride_xt + head * stride_xh

    # ---- logits z [BLOCK_T, BLOCK_E] = x · w^T, FP32-accurate, in registers -------------------------
    acc = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    if SPLIT_ACC:
        acc_small = tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        kk = d0 + dd
        if EVEN_D:
            x_mask = tok_ok[:, None]
            w_mask = col_ok[None, :]
        else:
            x_mask = tok_ok[:, None] & (kk < D)[None, :]
            w_mask = col_ok[None, :] & (kk < D)[:, None]
        xt = tl.load(x_rows[:, None] + kk[None, :], mask=x_mask, other=0.0)
        w_off = w_rows[None, :] + kk[:, None]  # [BLOCK_D, BLOCK_E]: w^T, contiguous along d
        w0, rest = _top_bf16(tl.load(w_ptr + w_off, mask=w_mask, other=0.0))
        w1, rest = _top_bf16(rest)
        w2, rest = _top_bf16(rest)
        if X_TERMS == 1:
            x0 = xt
        else:
            x0, xrest = _top_bf16(xt.to(tl.float32))
            x1, xrest = _top_bf16(xrest)
            if X_TERMS == 3:
                x2, xrest = _top_bf16(xrest)
        # Every product x_i · w_j with i + j <= 2, the smallest first: what is left out is below 2**-24
        # of |x|·|w| per product, the FP32 GEMM's own rounding.
        if SPLIT_ACC:
            small = acc_small
        else:
            small = acc
        small = _dot(x0, w2, small, UPCAST_DOT)
        if X_TERMS >= 2:
            small = _dot(x1, w1, small, UPCAST_DOT)
        if X_TERMS == 3:
            small = _dot(x2, w0, small, UPCAST_DOT)
        small = _dot(x0, w1, small, UPCAST_DOT)
        if X_TERMS >= 2:
            small = _dot(x1, w0, small, UPCAST_DOT)
        if SPLIT_ACC:
            acc_small = small
            acc = _dot(x0, w0, acc, UPCAST_DOT)
        else:
            acc = _dot(x0, w0, small, UPCAST_DOT)
    if SPLIT_ACC:
        z = acc + acc_small
    else:
        z = acc

    # ---- scores, selection keys ---------------------------------------------------------------------
    if SOFTMAX:
        z = tl.where(col_ok[None, :], z, float("-inf"))
        p = tl.exp(z - tl.max(z, axis=1)[:, None])
        s = p / tl.sum(p, axis=1)[:, None]
    else:
        s = 1.0 / (1.0 + tl.exp(-z))
    sel = s
    if HAS_BIAS:
        sel = s + tl.load(bias_ptr + head * E + cols, mask=col_ok, other=0.0)[None, :]
    sel = tl.where(sel == 0.0, 0.0, sel)  # -0.0 equals +0.0 for the comparison, so one key for both
    sel = tl.where(sel != sel, float("nan"), sel)  # every NaN -> the one positive NaN (ranks highest)
    bits = sel.to(tl.int32, bitcast=True)
    key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude, so int order = float order
    key = tl.where(col_ok[None, :], key, _REMOVED)

    # ---- top-k: the largest key, the lowest id holding it, its unbiased score ------------------------
    kcols = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)
    wts = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    for k in range(K):
        best = tl.max(key, axis=1)
        expert = tl.min(tl.where(key == best[:, None], cols[None, :], BLOCK_E), axis=1)
        hit = cols[None, :] == expert[:, None]
        key = tl.where(hit, _REMOVED, key)
        score = tl.sum(tl.where(hit, s, 0.0), axis=1)  # exactly s[expert]: one term, the rest zeros
        ids = tl.where(kcols[None, :] == k, expert[:, None], ids)
        wts = tl.where(kcols[None, :] == k, score[:, None], wts)
    if NORM:
        wts = wts / tl.maximum(tl.sum(tl.abs(wts), axis=1), 1e-12)[:, None]
    wts = wts * route_scale
    out = (head * n_tok + toks)[:, None] * K + kcols[None, :]
    mask = tok_ok[:, None] & (kcols < K)[None, :]
    tl.store(probs_ptr + out, wts, mask=mask)
    tl.store(idx_ptr + out, ids.to(tl.int64), mask=mask)


def fused_route(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    top_k: int,
    route_scale: float,
    route_norm: bool,
    score_func: ScoreFunc,
    config: RouteConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs [Hl, T, K] FP32, idx [Hl, T, K] int64)`` on validated inputs (launch only).

    ``config``: a :class:`RouteConfig` (None: :func:`default_config`).
    """
    t, hl, d = x.shape
    e = router_weight.shape[0] // hl
    probs = torch.empty((hl, t, top_k), dtype=torch.float32, device=x.device)
    idx = torch.empty((hl, t, top_k), dtype=torch.int64, device=x.device)
    if t == 0:
        return probs, idx
    x = x if x.stride(2) == 1 else x.contiguous()
    w = router_weight.contiguous()
    b = None if bias is None else bias.contiguous()
    cfg = config or default_config(t)
    interp = interpreting()
    block_t = _INTERPRETER_BLOCK_T if interp else cfg.block_t
    block_d = min(cfg.block_d, max(16, triton.next_power_of_2(d)))
    _route_kernel[(triton.cdiv(t, block_t), hl)](
        x,
        w,
        w if b is None else b,  # never read without HAS_BIAS
        probs,
        idx,
        t,
        x.stride(0),
        x.stride(1),
        float(route_scale),
        E=e,
        D=d,
        K=top_k,
        X_TERMS=_X_TERMS[x.dtype],
        HAS_BIAS=b is not None,
        SOFTMAX=score_func == "softmax",
        NORM=route_norm,
        SPLIT_ACC=cfg.split_acc,
        UPCAST_DOT=interp,
        EVEN_D=d % block_d == 0,
        WIDE_W=w.numel() >= 2**31,
        BLOCK_T=block_t,
        BLOCK_D=block_d,
        BLOCK_E=max(16, triton.next_power_of_2(e)),  # a dot's N of 16 at least (older Triton, Triton-MUSA)
        BLOCK_K=triton.next_power_of_2(top_k),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return probs, idx


class TritonFusedMoERoute:
    """Router GEMM (BF16x3 on tensor cores) + scores + biased top-k + weights, one kernel per head group."""

    version = triton.__version__

    def check(self, problem: Problem) -> Sequence[Reason]:
        return device_reasons(problem.device_type)

    def __call__(
        self,
        x: torch.Tensor,
        router_weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        top_k: int,
        route_scale: float,
        route_norm: bool,
        score_func: ScoreFunc,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_route(x, router_weight, bias, top_k=top_k, route_scale=route_scale, route_norm=route_norm,
                           score_func=score_func)


triton_fused_moe_route = TritonFusedMoERoute()
