"""Fused ``mhc_pre`` (operators.md §5.2): the streams read once for the logits, once for the branch input.

Two launches over the streams (for BF16 streams a small one before them splits the folded weight).
The first reads each token's flattened ``n·D`` row once: it accumulates the FP32 sum of
squares and the projection of ``x·(w[m] + 1)`` onto ``phi`` (over a tile of tokens, so each ``phi``
tile is read once per tile, not once per token: for BF16 streams three BF16 tensor-core dots against
the folded weight split in three exact pieces, otherwise an FP32 ``tl.dot``). The row's
``rsqrt(mean(x²) + eps)`` is a per-token scalar, so it commutes with the projection and the normalised
row is never written. The logits go to a small FP32 buffer (``T·(2n + n²)`` values); the BF16 kernel
may split the row into ``split_k`` chunks, each program writing its chunk's unscaled sums and sum of
squares, so that a pack whose few token tiles would leave most of the GPU idle still fills it. The
second launch adds the chunks in a fixed order (the result does not depend on scheduling), scales by
the norm, forms the sigmoid pre coefficients, rounds them to the streams' dtype (upstream's
materialisation), reads the streams again for the weighted sum (FP32, one cast), and writes the post
coefficients and the Sinkhorn-normalised residual matrix (a NaN anywhere in a token's matrix spreads to
all of it, as upstream's ``amax`` does).

The loop bounds (the row width, the stream width, the Sinkhorn iterations) are compile-time
constants: a model has a few of each.

Modalities: host-side group sizes become token (and, for the BF16 kernel, tile) boundaries passed as
scalar arguments (no host-to-device copy, so the call is CUDA-graph safe); one launch serves up to four
groups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from magi2_backend_triton.bf16 import rne_bf16, rne_bf16_bits
from magi2_backend_triton.interpret import interpreting

if TYPE_CHECKING:
    from magi2_core.backend import MHCPreCall

__all__ = ["LOGITS", "LOGITS_FP32", "LogitsConfig", "launch_mhc_pre"]

_MOD_PER_LAUNCH = 4


@dataclass(frozen=True)
class LogitsConfig:
    """The logits kernel's launch: tokens per tile (``tl.dot`` needs at least 16), the K step, the
    dot's FP32 precision, warps, pipeline stages and (``bf16x3`` only) the chunks each row is split
    into. ``benchmarks/mhc_sweep.py`` measures the candidates.

    Precisions: ``ieee`` (the FP32 dot on the FMA units); ``tf32x3`` (three TF32 tensor-core
    products); ``bf16x3`` (BF16 streams only): ``(w[m] + 1)·phi`` is formed in FP32 per modality and
    split into three BF16 pieces that sum to it (8 + 8 + 8 significant bits), so the streams, exact
    in BF16, meet each piece in a BF16 tensor-core product, exact in FP32, and only the FP32
    accumulation rounds; one launch per modality."""

    block_t: int = 32
    block_k: int = 128
    precision: str = "ieee"
    num_warps: int = 4
    num_stages: int = 2
    split_k: int = 1

    def __post_init__(self) -> None:
        if self.precision not in _PRECISIONS:
            raise ValueError(f"LogitsConfig.precision must be one of {_PRECISIONS}, got {self.precision!r}")
        if self.block_t < 16 or self.block_t & (self.block_t - 1) or self.block_k & (self.block_k - 1):
            raise ValueError(f"LogitsConfig: block_t (>= 16) and block_k must be powers of two, got {self}")
        if self.split_k < 1 or (self.split_k > 1 and self.precision != "bf16x3"):
            raise ValueError(f"LogitsConfig: split_k is >= 1, and above 1 for precision 'bf16x3' only, got {self}")


_PRECISIONS = ("ieee", "tf32x3", "bf16x3")
# The launches: BF16 streams take the split-BF16 tensor-core kernel, FP16 and FP32 streams (not exact
# in BF16) the FP32 dot; chosen by benchmarks/mhc_sweep.py and mhc_split_diagnose.py, results in
# docs/benchmarks.md.
LOGITS = LogitsConfig(block_t=128, block_k=64, precision="bf16x3", num_warps=8, num_stages=4)
LOGITS_FP32 = LogitsConfig(block_t=32, block_k=128, precision="ieee", num_warps=4, num_stages=2)
_BLOCK_T_APPLY = 2
_BLOCK_D = 512
_TL_DTYPE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


@triton.jit
def _rounded(x, DTYPE: tl.constexpr, RNE: tl.constexpr):
    """FP32 ``x`` rounded to ``DTYPE`` and back (RNE: by bit arithmetic, where the interpreter truncates)."""
    if RNE:
        return rne_bf16_bits(x).to(tl.float32, bitcast=True)
    else:
        return x.to(DTYPE).to(tl.float32)


@triton.jit
def _cast(x, DTYPE: tl.constexpr, RNE: tl.constexpr):
    if RNE:
        return rne_bf16(x)
    else:
        return x.to(DTYPE)


@triton.jit(do_not_specialize=["T", "b1", "b2", "b3"])
def _mhc_logits_kernel(
    x_ptr,
    w_ptr,
    phi_ptr,
    out_ptr,
    T,
    NL,
    stride_xt,
    stride_wm,
    b1,
    b2,
    b3,
    eps,
    K: tl.constexpr,
    NUM_MOD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    mod = tl.zeros_like(rows)
    if NUM_MOD > 1:
        mod += (rows >= b1).to(tl.int64)
    if NUM_MOD > 2:
        mod += (rows >= b2).to(tl.int64)
    if NUM_MOD > 3:
        mod += (rows >= b3).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < NL
    acc = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    sumsq = tl.zeros((BLOCK_T,), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        m = row_ok[:, None] & k_ok[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_xt + ks[None, :], mask=m, other=0.0).to(tl.float32)
        sumsq += tl.sum(x * x, axis=1)
        w = tl.load(w_ptr + mod[:, None] * stride_wm + ks[None, :], mask=m, other=0.0) + 1.0
        phi = tl.load(phi_ptr + ks[:, None] * NL + cols[None, :], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc += tl.dot(x * w, phi, input_precision=PRECISION)
    inv_rms = tl.math.rsqrt(sumsq / K + eps)
    tl.store(
        out_ptr + rows[:, None] * NL + cols[None, :], acc * inv_rms[:, None], mask=row_ok[:, None] & col_ok[None, :]
    )


@triton.jit(do_not_specialize=["T", "o1", "o2", "o3", "c1", "c2", "c3"])
def _mhc_logits_split_kernel(
    x_ptr,
    p_ptr,
    part_ptr,
    sq_ptr,
    T,
    NL,
    stride_xt,
    stride_part,
    stride_sq,
    o1,
    o2,
    o3,
    c1,
    c2,
    c3,
    K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Up to four modalities' tokens: ``x · (hi + mid + lo)`` as three BF16 dots over one ``K_CHUNK``
    of each row, ``p_ptr`` = ``[groups, 3, K, BLOCK_N]``. Program ``(tile, chunk)``: the tile's group
    is the last whose first tile (``c1..c3``) it reaches; its tokens start at ``o1..o3``. It writes the
    chunk's unscaled sums and sum of squares (``part[chunk]``, ``sq[chunk]``).

    The sum of squares reads the streams' tile through a load of its own (``.cg``: from L2, where the
    dots' load has just brought it), not the dots' operand, and each piece has its own accumulator,
    summed smallest first. With one load feeding both the dots and the sum of squares, pipelined
    launches on sm_90 (Triton 3.6) were not repeatable from run to run, a few rows far off in the
    chained-accumulator form; ``benchmarks/mhc_split_diagnose.py`` takes it apart, and the GPU tests
    run pipelined launches twice against float64."""
    tile = tl.program_id(0)
    chunk = tl.program_id(1)
    g = (tile >= c1).to(tl.int32) + (tile >= c2).to(tl.int32) + (tile >= c3).to(tl.int32)
    first_tile = tl.where(g == 0, 0, tl.where(g == 1, c1, tl.where(g == 2, c2, c3)))
    start = tl.where(g == 0, 0, tl.where(g == 1, o1, tl.where(g == 2, o2, o3)))
    end = tl.where(g == 0, o1, tl.where(g == 1, o2, tl.where(g == 2, o3, T)))
    rows = start.to(tl.int64) + (tile - first_tile).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < end
    cols = tl.arange(0, BLOCK_N)
    pieces = p_ptr + g.to(tl.int64) * (3 * K * BLOCK_N)
    acc_hi = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    acc_mid = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    acc_lo = tl.zeros((BLOCK_T, BLOCK_N), tl.float32)
    sumsq = tl.zeros((BLOCK_T,), tl.float32)
    k_start = chunk * K_CHUNK
    for k0 in range(0, K_CHUNK, BLOCK_K):  # compile-time bounds (older interpreters need them)
        ks = k_start + k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        xp = x_ptr + rows[:, None] * stride_xt + ks[None, :]
        m = row_ok[:, None] & k_ok[None, :]
        x = tl.load(xp, mask=m, other=0.0)
        xf = tl.load(xp, mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
        sumsq += tl.sum(xf * xf, axis=1)
        piece = pieces + ks[:, None] * BLOCK_N + cols[None, :]
        hi = tl.load(piece, mask=k_ok[:, None], other=0.0)
        mid = tl.load(piece + K * BLOCK_N, mask=k_ok[:, None], other=0.0)
        lo = tl.load(piece + 2 * K * BLOCK_N, mask=k_ok[:, None], other=0.0)
        if UPCAST:  # the interpreter multiplies the raw bits of BF16 dot operands: hand it FP32 values
            acc_hi += tl.dot(xf, hi.to(tl.float32), input_precision="ieee")
            acc_mid += tl.dot(xf, mid.to(tl.float32), input_precision="ieee")
            acc_lo += tl.dot(xf, lo.to(tl.float32), input_precision="ieee")
        else:
            acc_hi = tl.dot(x, hi, acc_hi)
            acc_mid = tl.dot(x, mid, acc_mid)
            acc_lo = tl.dot(x, lo, acc_lo)
    acc = (acc_lo + acc_mid) + acc_hi
    out = part_ptr + chunk.to(tl.int64) * stride_part + rows[:, None] * NL + cols[None, :]
    tl.store(out, acc, mask=row_ok[:, None] & (cols < NL)[None, :])
    tl.store(sq_ptr + chunk.to(tl.int64) * stride_sq + rows, sumsq, mask=row_ok)


@triton.jit
def _mhc_pieces_kernel(
    w_ptr,
    phi_ptr,
    p_ptr,
    NL,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
    RNE: tl.constexpr,
):
    """Program ``(modality, k block)``: ``(w[m] + 1)·phi`` in FP32 split into ``hi + mid + lo`` (each
    the BF16 rounding of what the pieces before it leave), the columns past ``NL`` zero, written to
    ``p_ptr`` = ``[M, 3, K, BLOCK_N]``."""
    m = tl.program_id(0).to(tl.int64)
    ks = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    cols = tl.arange(0, BLOCK_N)
    k_ok = ks < K
    col_ok = cols < NL
    w = tl.load(w_ptr + m * K + ks, mask=k_ok, other=0.0)
    phi = tl.load(phi_ptr + ks[:, None] * NL + cols[None, :], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
    folded = (w + 1.0)[:, None] * phi  # FP32 add, then FP32 product: the fold the reference forms
    folded = tl.where(col_ok[None, :], folded, 0.0)
    hi = _cast(folded, tl.bfloat16, RNE)
    rest = folded - hi.to(tl.float32)
    mid = _cast(rest, tl.bfloat16, RNE)
    lo = _cast(rest - mid.to(tl.float32), tl.bfloat16, RNE)
    out = p_ptr + m * (3 * K * BLOCK_N) + ks[:, None] * BLOCK_N + cols[None, :]
    tl.store(out, hi, mask=k_ok[:, None])
    tl.store(out + K * BLOCK_N, mid, mask=k_ok[:, None])
    tl.store(out + 2 * K * BLOCK_N, lo, mask=k_ok[:, None])


_BLOCK_K_PIECES = 64


def split_pieces(w: torch.Tensor, phi: torch.Tensor, block_n: int) -> torch.Tensor:
    """``[M, 3, K, block_n]`` BF16 from contiguous FP32 ``w`` (``[M·K]`` or ``[M, K]``) and ``phi [K, NL]``:
    per modality, ``(w[m] + 1)·phi`` in FP32 as hi + mid + lo, in one launch (it is formed again on
    every call: a copy kept between calls would go stale when a parameter's storage is replaced)."""
    k = phi.shape[0]
    m = w.numel() // k if k else 0
    pieces = torch.empty((m, 3, k, block_n), dtype=torch.bfloat16, device=phi.device)
    if m and k:
        _mhc_pieces_kernel[(m, triton.cdiv(k, _BLOCK_K_PIECES))](
            w,
            phi,
            pieces,
            phi.shape[1],
            K=k,
            BLOCK_K=_BLOCK_K_PIECES,
            BLOCK_N=block_n,
            RNE=interpreting(),
            num_warps=4,
            # no FMA contraction: the split must start from the rounded FP32 product, as torch forms it
            enable_fp_fusion=False,
        )
    return pieces


@triton.jit
def _logits(logits_ptr, offs, mask, inv, stride_part, PARTS: tl.constexpr):
    """The logits at ``offs``: as stored (``PARTS`` 0), or the ``PARTS`` chunks added in order and scaled
    by the row's ``inv`` (the norm's reciprocal root)."""
    v = tl.load(logits_ptr + offs, mask=mask, other=0.0)
    if PARTS > 0:
        for p in tl.static_range(1, PARTS):
            v += tl.load(logits_ptr + p * stride_part + offs, mask=mask, other=0.0)
        v = v * inv
    return v


@triton.jit(do_not_specialize=["T"])
def _mhc_apply_kernel(
    x_ptr,
    logits_ptr,
    sq_ptr,
    a_pre_ptr,
    a_post_ptr,
    a_res_ptr,
    b_pre_ptr,
    b_post_ptr,
    b_res_ptr,
    h_ptr,
    post_ptr,
    res_ptr,
    T,
    stride_xt,
    stride_xn,
    scale,
    norm_eps,
    sinkhorn_eps,
    PARTS: tl.constexpr,
    D: tl.constexpr,
    ITERATIONS: tl.constexpr,
    N: tl.constexpr,
    NP: tl.constexpr,
    NL: tl.constexpr,
    X_DTYPE: tl.constexpr,
    OUT_DTYPE: tl.constexpr,
    X_RNE: tl.constexpr,
    OUT_RNE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    row_ok = rows < T
    i = tl.arange(0, NP)
    i_ok = i < N
    ti = row_ok[:, None] & i_ok[None, :]
    lg = rows[:, None] * NL + i[None, :]
    inv = tl.full((BLOCK_T,), 1.0, tl.float32)
    if PARTS > 0:  # the chunks' sums of squares, in chunk order
        sumsq = tl.load(sq_ptr + rows, mask=row_ok, other=0.0)
        for p in tl.static_range(1, PARTS):
            sumsq += tl.load(sq_ptr + p * T.to(tl.int64) + rows, mask=row_ok, other=0.0)
        inv = tl.math.rsqrt(sumsq / (N * D) + norm_eps)

    # pre coefficients, rounded to the streams' dtype before the weighted sum (as upstream)
    a_pre = tl.load(a_pre_ptr)
    logit = _logits(logits_ptr, lg, ti, inv[:, None], T.to(tl.int64) * NL, PARTS)
    c = tl.sigmoid((a_pre * scale) * logit + tl.load(b_pre_ptr + i, mask=i_ok, other=0.0))
    c = tl.where(ti, _rounded(c, X_DTYPE, X_RNE), 0.0)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        c_ok = cols < D
        m3 = ti[:, :, None] & c_ok[None, None, :]
        x = tl.load(
            x_ptr + rows[:, None, None] * stride_xt + i[None, :, None] * stride_xn + cols[None, None, :],
            mask=m3,
            other=0.0,
        ).to(tl.float32)
        h = tl.sum(c[:, :, None] * x, axis=1)
        tl.store(
            h_ptr + rows[:, None] * D + cols[None, :], _cast(h, X_DTYPE, X_RNE), mask=row_ok[:, None] & c_ok[None, :]
        )

    a_post = tl.load(a_post_ptr)
    logit = _logits(logits_ptr, lg + N, ti, inv[:, None], T.to(tl.int64) * NL, PARTS)
    post = 2.0 * tl.sigmoid((a_post * scale) * logit + tl.load(b_post_ptr + i, mask=i_ok, other=0.0))
    tl.store(post_ptr + rows[:, None] * N + i[None, :], _cast(post, OUT_DTYPE, OUT_RNE), mask=ti)

    # residual matrix [BLOCK_T, NP (i), NP (j)]: Sinkhorn-Knopp, pads held at 0
    j = tl.arange(0, NP)
    ok2 = i_ok[:, None] & (j < N)[None, :]
    m3 = row_ok[:, None, None] & ok2[None, :, :]
    ij = i[:, None] * N + j[None, :]
    a_res = tl.load(a_res_ptr)
    lr = _logits(
        logits_ptr,
        rows[:, None, None] * NL + 2 * N + ij[None, :, :],
        m3,
        inv[:, None, None],
        T.to(tl.int64) * NL,
        PARTS,
    )
    mat = (a_res * scale) * lr + tl.load(b_res_ptr + ij, mask=ok2, other=0.0)[None, :, :]
    mat = tl.where(ok2[None, :, :], mat, float("-inf"))
    has_nan = tl.sum(tl.sum((mat != mat).to(tl.int32), axis=2), axis=1) != 0
    peak = tl.max(tl.max(mat, axis=2), axis=1)
    peak = tl.where(has_nan, float("nan"), peak)
    mat = tl.where(ok2[None, :, :], tl.exp(mat - peak[:, None, None]), 0.0)
    for _ in range(ITERATIONS):
        mat = mat / (tl.sum(mat, axis=1)[:, None, :] + sinkhorn_eps)
        mat = mat / (tl.sum(mat, axis=2)[:, :, None] + sinkhorn_eps)
    tl.store(res_ptr + rows[:, None, None] * (N * N) + ij[None, :, :], _cast(mat, OUT_DTYPE, OUT_RNE), mask=m3)


def launch_mhc_pre(
    call: MHCPreCall, logits_config: LogitsConfig = LOGITS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run both kernels for a validated call; returns ``(branch_input, post, residual)``."""
    x = call.streams if call.streams.stride(2) == 1 else call.streams.contiguous()
    t, n, d = x.shape
    od = call.out_dtype
    h = torch.empty((t, d), dtype=x.dtype, device=x.device)
    post = torch.empty((t, n), dtype=od, device=x.device)
    res = torch.empty((t, n, n), dtype=od, device=x.device)
    if t == 0:
        return h, post, res
    k, nl = n * d, 2 * n + n * n
    flat = x.reshape(t, k)  # a view for [T, n, D] with contiguous rows; a copy otherwise
    w = call.norm_weight.contiguous()  # flat [M·n·D] or [M, n·D]: modality m's scale starts at m·n·D
    phi = call.phi.contiguous()
    sizes = [t] if call.modality_sizes is None else list(call.modality_sizes)
    cfg = logits_config
    eps = float(call.eps)
    if cfg.precision == "bf16x3" and x.dtype == torch.bfloat16:
        logits, sumsq = _split_partials(flat, w, phi, sizes, cfg)
        parts = cfg.split_k
    else:
        fp32 = LOGITS_FP32 if cfg.precision == "bf16x3" else cfg  # other dtypes: not exact in BF16
        logits = torch.empty((t, nl), dtype=torch.float32, device=x.device)
        _fp32_logits(flat, w, phi, logits, sizes, eps, fp32)
        sumsq, parts = logits, 0  # the logits come scaled: no sums of squares to read
    interp = interpreting()
    _mhc_apply_kernel[(triton.cdiv(t, _BLOCK_T_APPLY),)](
        x,
        logits,
        sumsq,
        call.alpha_pre,
        call.alpha_post,
        call.alpha_res,
        call.bias_pre.contiguous(),
        call.bias_post.contiguous(),
        call.bias_res.contiguous(),
        h,
        post,
        res,
        t,
        x.stride(0),
        x.stride(1),
        1.0 / math.sqrt(k),
        eps,
        float(call.sinkhorn_eps),
        PARTS=parts,
        D=d,
        ITERATIONS=call.sinkhorn_iterations,
        N=n,
        NP=triton.next_power_of_2(n),
        NL=nl,
        X_DTYPE=_TL_DTYPE[x.dtype],
        OUT_DTYPE=_TL_DTYPE[od],
        X_RNE=interp and x.dtype == torch.bfloat16,
        OUT_RNE=interp and od == torch.bfloat16,
        BLOCK_T=_BLOCK_T_APPLY,
        BLOCK_D=_BLOCK_D,
        num_warps=4,
    )
    return h, post, res


def _fp32_logits(
    flat: torch.Tensor,
    w: torch.Tensor,
    phi: torch.Tensor,
    logits: torch.Tensor,
    sizes: list[int],
    eps: float,
    cfg: LogitsConfig,
) -> None:
    """The FP32 dot, up to four modality groups per launch (rows find their group from the bounds)."""
    k, nl = flat.shape[1], logits.shape[1]
    t0 = 0
    for g0 in range(0, len(sizes), _MOD_PER_LAUNCH):
        group = sizes[g0 : g0 + _MOD_PER_LAUNCH]
        t1 = t0 + sum(group)
        if t1 > t0:
            bounds = [sum(group[: i + 1]) for i in range(len(group) - 1)]
            bounds += [0] * (_MOD_PER_LAUNCH - 1 - len(bounds))
            _mhc_logits_kernel[(triton.cdiv(t1 - t0, cfg.block_t),)](
                flat[t0:t1],
                w if g0 == 0 else w.reshape(-1)[g0 * k :],  # contiguous: modality g0's scale onward
                phi,
                logits[t0:t1],
                t1 - t0,
                nl,
                flat.stride(0),
                k,
                bounds[0],
                bounds[1],
                bounds[2],
                eps,
                K=k,
                NUM_MOD=len(group),
                BLOCK_T=cfg.block_t,
                BLOCK_K=cfg.block_k,
                BLOCK_N=max(16, triton.next_power_of_2(nl)),
                PRECISION=cfg.precision,
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
            )
        t0 = t1


def _split_partials(
    flat: torch.Tensor, w: torch.Tensor, phi: torch.Tensor, sizes: list[int], cfg: LogitsConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """BF16 streams against the split folded weight: ``[split_k, T, NL]`` unscaled sums and
    ``[split_k, T]`` sums of squares, one launch per four modality groups."""
    t, k = flat.shape
    nl = phi.shape[1]
    block_n = max(16, triton.next_power_of_2(nl))
    pieces = split_pieces(w, phi, block_n)
    parts = torch.empty((cfg.split_k, t, nl), dtype=torch.float32, device=flat.device)
    sumsq = torch.empty((cfg.split_k, t), dtype=torch.float32, device=flat.device)
    k_chunk = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    t0 = 0
    for g0 in range(0, len(sizes), _MOD_PER_LAUNCH):
        group = (sizes[g0 : g0 + _MOD_PER_LAUNCH] + [0] * _MOD_PER_LAUNCH)[:_MOD_PER_LAUNCH]  # padded to four
        starts = [sum(group[:i]) for i in range(1, _MOD_PER_LAUNCH)]
        tiles = [sum(triton.cdiv(s, cfg.block_t) for s in group[:i]) for i in range(1, _MOD_PER_LAUNCH + 1)]
        size = sum(group)
        if size:
            _mhc_logits_split_kernel[(tiles[-1], cfg.split_k)](
                flat[t0:],
                pieces[g0:],
                parts[:, t0:],
                sumsq[:, t0:],
                size,
                nl,
                flat.stride(0),
                parts.stride(0),
                sumsq.stride(0),
                *starts,
                *tiles[:-1],
                K=k,
                K_CHUNK=k_chunk,
                BLOCK_T=cfg.block_t,
                BLOCK_K=cfg.block_k,
                BLOCK_N=block_n,
                UPCAST=interpreting(),
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
            )
        t0 += size
    return parts, sumsq
