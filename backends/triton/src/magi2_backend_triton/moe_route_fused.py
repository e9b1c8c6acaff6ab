"""The ``triton_fused`` provider of ``moe_route``: the whole routing call in one kernel per head group.

One program routes ``BLOCK_T`` tokens of one head. It walks the head's experts in chunks of
``BLOCK_N``: per chunk, the router GEMM on tensor cores into a ``[BLOCK_T, BLOCK_N]`` accumulator, the
scores (sigmoid or softmax), the bias (selection only), and the chunk's own top-k into its slots of a
per-row candidate list held in registers (``[BLOCK_T, BLOCK_C]`` keys, ids, unbiased scores); then the
row's top-k among the candidates, the L1 normalisation and ``route_scale``. The logits are never written
to memory. The program reads its head's router once per ``BLOCK_T`` tokens and re-reads only its x tile
per chunk.

FP32-accurate logits from BF16 tensor-core dots ("BF16x3"). The kernel reads the FP32 router weight and
splits it exactly, in registers, into three BF16 planes, ``w = hi + mid + lo`` (truncation: ``hi`` is
the top 16 bits, ``mid`` the top 16 bits of the rest, ``lo`` the rest, at most 8 significant bits; exact
for ``|w| >= 2**-110``). A BF16 activation times a BF16 plane is exact in FP32, so
``x·lo + x·mid + x·hi`` summed in FP32 is the FP32 GEMM up to summation order. ``x·hi`` has its own
accumulator (``split_acc``): tensor cores may truncate when they add into the accumulator, and keeping
the small terms apart keeps that error at the FP32 GEMM's level (the CPU emulation in
``benchmarks/route_split_accuracy.py``). FP16 and FP32 activations are split the same way (into 2 and 3
BF16 terms) and every product whose order is below ``2**-24`` is kept, so they too get FP32-accurate
logits on tensor cores (5 and 6 dots instead of 3).

No planes are kept in memory: a derived copy of the router would go stale after writes that bypass
the version counter and would outlive the layer's storage across layer-wise offload (what reading them
from memory would save: docs/moe-notes.md, "the fused router").

Selection. The selection scores become int32 keys of the same order (every NaN folded into the one
positive NaN, which ranks above ``+inf`` as in torch's sort; a score is never ``-0.0``). A chunk's top
``CHUNK_K = min(top_k, BLOCK_N)`` are ``CHUNK_K`` reductions of (key, id, score) triples whose combine
keeps the larger key and, on equal keys, the lower id (so exact ties go to the lowest id; under the
interpreter a max, a min-id and a one-term sum, the same answer faster there), each winner
knocked out with a key below every real one (so a ``-inf`` bias is chosen only once the row has nothing
else left). The chunks' slots hold distinct experts; the row's top-k among them is ``top_k`` more such
reductions (none with one chunk: its slots are the answer, in order).
Softmax needs the row's normaliser before any biased selection score is known: a first pass over the
chunks keeps the row's running max and sum, a second recomputes the logits and selects (twice the
GEMM; sigmoid, the release's scoring, takes one pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
import triton
import triton.language as tl

from magi2_backend_triton.interpret import interpreting
from magi2_backend_triton.providers import described_reasons, device_reasons
from magi2_core.backend import CheckedOn, Problem, Reason, ScoreFunc, VirtualDevice

if TYPE_CHECKING:
    from magi2_core.backend import RouteCall

__all__ = [
    "CANDIDATES",
    "DEFAULTS",
    "SHARED_BUDGET",
    "RouteConfig",
    "TritonFusedMoERoute",
    "default_config",
    "fused_route",
    "triton_fused_moe_route",
]


class RouteConfig(NamedTuple):
    """One launch configuration: tokens per program, experts per chunk, hidden slice per step, warps,
    pipeline stages, and whether ``x·hi`` has its own accumulator (twice the accumulator registers,
    FP32-GEMM-level error)."""

    block_t: int
    block_n: int
    block_d: int
    num_warps: int
    num_stages: int
    split_acc: bool = True

    @property
    def name(self) -> str:
        return f"t{self.block_t}_n{self.block_n}_d{self.block_d}_w{self.num_warps}_s{self.num_stages}" + (
            "" if self.split_acc else "_1acc"
        )

    def shared_bytes(self, x_dtype: torch.dtype = torch.bfloat16) -> int:
        """Shared memory, an upper bound: per pipeline stage an x slice and the FP32 weight slice; the
        three BF16 planes the dots read (formed in registers, staged once per step); for FP16/FP32 x
        (split in registers too) its BF16 terms."""
        x_terms = _X_TERMS[x_dtype] if _X_TERMS[x_dtype] > 1 else 0
        x_bytes = torch.empty((), dtype=x_dtype).element_size()
        return (
            self.num_stages * (self.block_t * self.block_d * x_bytes + self.block_d * self.block_n * 4)
            + 3 * self.block_d * self.block_n * 2
            + x_terms * self.block_t * self.block_d * 2
        )

    def fitted(self, x_dtype: torch.dtype) -> RouteConfig:
        """This config, its hidden slice halved (to 16 at least) until it fits :data:`SHARED_BUDGET` with
        ``x_dtype`` activations: FP32 x doubles the x slices and adds its split terms."""
        cfg = self
        while cfg.shared_bytes(x_dtype) > SHARED_BUDGET and cfg.block_d > 16:
            cfg = cfg._replace(block_d=cfg.block_d // 2)
        return cfg

    def registers(self) -> int:
        """FP32 registers per thread of one ``[BLOCK_T, BLOCK_N]`` tile (the GEMM holds two with
        ``split_acc``, the selection about three: logits, scores, keys)."""
        return self.block_t * self.block_n // (32 * self.num_warps)


# What one program may take of the H200's 227 KiB of shared memory per block, the rest left to the
# reductions' scratch: every candidate fits it at BF16 and FP32 activations (a test checks).
SHARED_BUDGET = 220 * 1024

# What benchmarks/route_profile.py times, at E = 256. Token blocks of 64 and 128 feed Hopper's 64-row
# MMAs (one warpgroup per 64 rows with 8 warps at 128); chunks of 64-128 experts keep a tile at 32-64
# registers per thread (RouteConfig.registers); 256 experts in one chunk is the whole-row program,
# with small token blocks (at T = 512 x 3 heads a 128-token block leaves 12 programs for 132 SMs).
CANDIDATES: tuple[RouteConfig, ...] = (
    RouteConfig(16, 256, 32, 4, 3),
    RouteConfig(32, 256, 32, 4, 3),
    RouteConfig(32, 128, 32, 4, 3),
    RouteConfig(64, 64, 32, 4, 3),
    RouteConfig(64, 64, 32, 4, 3, split_acc=False),
    RouteConfig(64, 128, 32, 4, 3),
    RouteConfig(128, 64, 32, 8, 3),
    RouteConfig(128, 64, 32, 8, 3, split_acc=False),
    RouteConfig(128, 128, 32, 8, 3),
)

# The default, by routed rows (local tokens x heads): (most rows served, config), the last row for every
# larger call: the fastest of the CANDIDATES in benchmarks/route_profile.py's sweep (docs/moe-notes.md,
# "the fused router").
DEFAULTS: tuple[tuple[int | None, RouteConfig], ...] = (
    (4096 * 3, RouteConfig(16, 256, 32, 4, 3)),
    (None, RouteConfig(32, 256, 32, 4, 3)),
)

# The interpreter pays per program and per op, not per warp: a bigger token block keeps the CPU tests
# fast, and chunks of 16 experts make every CPU test with E > 16 select across chunks.
_INTERPRETER = RouteConfig(32, 16, 32, 4, 1)
# Activations split into this many BF16 terms: BF16 is one already; FP16 has 11 significant bits, FP32 24.
_X_TERMS = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}
# Below every real key: the order-mapped -inf is -2**31 + 2**23 - 1. Knocked-out experts, masked columns
# and the unused candidate slots hold it; such an entry is picked only when a chunk has fewer than CHUNK_K
# real experts left, and never in the final selection (the chunks hold top_k <= E real candidates).
_REMOVED = tl.constexpr(-(2**31))
# Above every expert id: the id of an empty candidate slot.
_NO_ID = tl.constexpr(2**30)


def default_config(rows: int) -> RouteConfig:
    """The DEFAULTS row for a call routing ``rows`` = tokens x heads."""
    for limit, cfg in DEFAULTS:
        if limit is None or rows <= limit:
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


@triton.jit
def _chunk_logits(
    x_rows,
    tok_ok,
    w_ptr,
    w_rows,
    col_ok,
    plane_stride,
    D: tl.constexpr,
    X_TERMS: tl.constexpr,
    SPLIT_ACC: tl.constexpr,
    PLANES: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    EVEN_D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """``z [BLOCK_T, BLOCK_N] = x · w^T`` of one expert chunk, FP32-accurate (``w_rows``: each chunk
    expert's router row offset)."""
    dd = tl.arange(0, BLOCK_D)
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    if SPLIT_ACC:
        acc_small = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        kk = d0 + dd
        if EVEN_D:
            x_mask = tok_ok[:, None]
            w_mask = col_ok[None, :]
        else:
            x_mask = tok_ok[:, None] & (kk < D)[None, :]
            w_mask = col_ok[None, :] & (kk < D)[:, None]
        xt = tl.load(x_rows[:, None] + kk[None, :], mask=x_mask, other=0.0)
        # [BLOCK_D, BLOCK_N]: w^T, contiguous along d
        w_at = w_ptr + w_rows[None, :] + kk[:, None]
        if PLANES:  # prepared: the three BF16 planes, hi, mid, lo, plane_stride elements apart
            w0 = tl.load(w_at, mask=w_mask, other=0.0)
            w1 = tl.load(w_at + plane_stride, mask=w_mask, other=0.0)
            w2 = tl.load(w_at + plane_stride + plane_stride, mask=w_mask, other=0.0)  # (no int32 2x overflow)
        else:
            w0, rest = _top_bf16(tl.load(w_at, mask=w_mask, other=0.0))
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
    return z


@triton.jit
def _better(key_a, id_a, s_a, key_b, id_b, s_b):
    """The combine of the selection's reduction: the larger key, on equal keys the lower expert id."""
    take_a = (key_a > key_b) | ((key_a == key_b) & (id_a < id_b))
    return tl.where(take_a, key_a, key_b), tl.where(take_a, id_a, id_b), tl.where(take_a, s_a, s_b)


@triton.jit
def _best(key, ids, s, TRIPLES: tl.constexpr):
    """Per row: the largest key, the lowest id holding it, and the score of that (key, id) entry.

    ``TRIPLES``: one reduction of (key, id, score) triples (the GPU's path); otherwise a max, a min over
    the ids holding it and a masked sum over the entries with that key and id (one term: a candidate
    list may repeat a real expert's id on a removed-key entry picked from an exhausted chunk): the same
    answer, and what the interpreter runs fast (it walks a custom combine element by element in Python)."""
    if TRIPLES:
        best, expert, score = tl.reduce((key, ids, s), 1, _better)
    else:
        best = tl.max(key, axis=1)
        expert = tl.min(tl.where(key == best[:, None], ids, _NO_ID), axis=1)
        hit = (ids == expert[:, None]) & (key == best[:, None])
        score = tl.sum(tl.where(hit, s, 0.0), axis=1)
    return best, expert, score


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
    plane_stride,
    route_scale,
    E: tl.constexpr,
    D: tl.constexpr,
    K: tl.constexpr,
    X_TERMS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SOFTMAX: tl.constexpr,
    NORM: tl.constexpr,
    SPLIT_ACC: tl.constexpr,
    PLANES: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    TRIPLES: tl.constexpr,
    EVEN_D: tl.constexpr,
    WIDE_W: tl.constexpr,
    ABLATE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CHUNK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    head = tl.program_id(1).to(tl.int64)
    toks = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_ok = toks < n_tok
    cols = tl.arange(0, BLOCK_N)
    x_rows = x_ptr + toks * stride_xt + head * stride_xh
    N_CHUNKS: tl.constexpr = (E + BLOCK_N - 1) // BLOCK_N

    # ---- softmax only: the row's max and normaliser, over every chunk (online) -----------------------
    if SOFTMAX:
        row_max = tl.full([BLOCK_T], float("-inf"), dtype=tl.float32)
        row_sum = tl.zeros([BLOCK_T], dtype=tl.float32)
        for n0 in range(0, E, BLOCK_N):
            ids = n0 + cols
            col_ok = ids < E
            w_rows = tl.program_id(1) * E + ids
            if WIDE_W:  # the weight past 2**31 elements: int64 offsets (int32 is cheaper on every tile)
                w_rows = w_rows.to(tl.int64)
            z = _chunk_logits(
                x_rows,
                tok_ok,
                w_ptr,
                w_rows * D,
                col_ok,
                plane_stride,
                D,
                X_TERMS,
                SPLIT_ACC,
                PLANES,
                UPCAST_DOT,
                EVEN_D,
                BLOCK_T,
                BLOCK_N,
                BLOCK_D,
            )
            z = tl.where(col_ok[None, :], z, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(z, axis=1))
            # equal maxima (-inf included: no NaN from -inf - -inf) keep the sum as it is
            rescale = tl.where(new_max == row_max, 1.0, tl.exp(row_max - new_max))
            # a -inf logit adds 0, also while the row's max is still -inf
            p = tl.where(z == float("-inf"), 0.0, tl.exp(z - new_max[:, None]))
            row_sum = row_sum * rescale + tl.sum(p, axis=1)
            row_max = new_max

    # ---- per chunk: logits, scores, keys; the chunk's top CHUNK_K into its slots of the candidates -----
    kcols = tl.arange(0, BLOCK_K)
    ccols = tl.arange(0, BLOCK_C)
    # the candidates: CHUNK_K slots per chunk (distinct experts: each chunk's columns once), in registers
    cand_key = tl.full([BLOCK_T, BLOCK_C], _REMOVED, dtype=tl.int32)
    cand_id = tl.full([BLOCK_T, BLOCK_C], _NO_ID, dtype=tl.int32)
    cand_s = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    check = tl.zeros([BLOCK_T], dtype=tl.float32)
    for n0 in range(0, E, BLOCK_N):
        ids = n0 + cols
        col_ok = ids < E
        w_rows = tl.program_id(1) * E + ids
        if WIDE_W:
            w_rows = w_rows.to(tl.int64)
        z = _chunk_logits(
            x_rows,
            tok_ok,
            w_ptr,
            w_rows * D,
            col_ok,
            plane_stride,
            D,
            X_TERMS,
            SPLIT_ACC,
            PLANES,
            UPCAST_DOT,
            EVEN_D,
            BLOCK_T,
            BLOCK_N,
            BLOCK_D,
        )
        if ABLATE == 1:  # measurement only: the GEMM without the selection
            check += tl.sum(z, axis=1)
        else:
            if SOFTMAX:
                s = tl.exp(z - row_max[:, None]) / row_sum[:, None]
            else:
                s = 1.0 / (1.0 + tl.exp(-z))
            sel = s
            if HAS_BIAS:
                sel = s + tl.load(bias_ptr + head * E + ids, mask=col_ok, other=0.0)[None, :]
            # (never -0.0: the scores are +0.0 or more, and +0.0 + -0.0 is +0.0, so no fold is needed)
            sel = tl.where(sel != sel, float("nan"), sel)  # every NaN -> the one positive NaN (ranks highest)
            bits = sel.to(tl.int32, bitcast=True)
            key = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude, so int order = float order
            key = tl.where(col_ok[None, :], key, _REMOVED)
            chunk_ids = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.int32) + ids[None, :]
            chunk = n0 // BLOCK_N
            # the chunk's own top CHUNK_K, in order, into its CHUNK_K slots: one reduction per winner
            for k in tl.static_range(CHUNK_K):
                best, expert, score = _best(key, chunk_ids, s, TRIPLES)
                key = tl.where(chunk_ids == expert[:, None], _REMOVED, key)
                slot = (ccols == chunk * CHUNK_K + k)[None, :]
                cand_key = tl.where(slot, best[:, None], cand_key)
                cand_id = tl.where(slot, expert[:, None], cand_id)
                cand_s = tl.where(slot, score[:, None], cand_s)

    if ABLATE == 1:
        out = (head * n_tok + toks)[:, None] * K + kcols[None, :]
        mask = tok_ok[:, None] & (kcols < 1)[None, :]
        tl.store(probs_ptr + out, check[:, None] + tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32), mask=mask)
    else:
        # ---- the row's top K among the candidates (distinct experts: each chunk's columns once) --------
        if N_CHUNKS == 1:
            run_id = cand_id
            run_s = cand_s
        else:
            run_id = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)
            run_s = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
            for k in tl.static_range(K):
                best, expert, score = _best(cand_key, cand_id, cand_s, TRIPLES)
                cand_key = tl.where(cand_id == expert[:, None], _REMOVED, cand_key)
                slot = (kcols == k)[None, :]
                run_id = tl.where(slot, expert[:, None], run_id)
                run_s = tl.where(slot, score[:, None], run_s)
        if N_CHUNKS == 1:
            kk = tl.arange(0, BLOCK_C)
        else:
            kk = tl.arange(0, BLOCK_K)
        wts = tl.where((kk < K)[None, :], run_s, 0.0)
        if NORM:
            wts = wts / tl.maximum(tl.sum(tl.abs(wts), axis=1), 1e-12)[:, None]
        wts = wts * route_scale
        out = (head * n_tok + toks)[:, None] * K + kk[None, :]
        mask = tok_ok[:, None] & (kk < K)[None, :]
        tl.store(probs_ptr + out, wts, mask=mask)
        tl.store(idx_ptr + out, run_id.to(tl.int64), mask=mask)


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
    _triples: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs [Hl, T, K] FP32, idx [Hl, T, K] int64)`` on validated inputs (launch only).

    ``config``: a :class:`RouteConfig` (None: :func:`default_config`; under the interpreter a CPU-sized one).
    ``_triples`` (tests): the selection's reduction of triples (None: on CUDA, not under the interpreter).
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
    interp = interpreting()
    cfg = (config or (_INTERPRETER if interp else default_config(t * hl))).fitted(x.dtype)
    block_t = _INTERPRETER.block_t if interp else cfg.block_t
    # a dot's N and K of 16 at least (older Triton, Triton-MUSA); no wider than the bank and the row
    block_n = min(cfg.block_n, max(16, triton.next_power_of_2(e)))
    block_d = min(cfg.block_d, max(16, triton.next_power_of_2(d)))
    chunk_k = min(top_k, block_n)
    grid = (triton.cdiv(t, block_t), hl)
    _route_kernel[grid](
        x,
        w,
        w if b is None else b,  # never read without HAS_BIAS
        probs,
        idx,
        t,
        x.stride(0),
        x.stride(1),
        w.numel(),
        float(route_scale),
        E=e,
        D=d,
        K=top_k,
        X_TERMS=_X_TERMS[x.dtype],
        HAS_BIAS=b is not None,
        SOFTMAX=score_func == "softmax",
        NORM=route_norm,
        SPLIT_ACC=cfg.split_acc,
        PLANES=False,
        UPCAST_DOT=interp,
        # the reduction of triples is measured on CUDA only; elsewhere (Triton-MUSA, the interpreter) the
        # max / min-id / one-term-sum selection, bit-equal, that the earlier kernel's operations match
        TRIPLES=(x.device.type == "cuda" and not interp) if _triples is None else _triples,
        EVEN_D=d % block_d == 0,
        WIDE_W=w.numel() >= 2**31,
        ABLATE=0,
        BLOCK_T=block_t,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        BLOCK_K=triton.next_power_of_2(top_k),
        CHUNK_K=chunk_k,
        BLOCK_C=triton.next_power_of_2(triton.cdiv(e, block_n) * chunk_k),
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return probs, idx


class TritonFusedMoERoute:
    """Router GEMM (BF16x3 on tensor cores) + scores + biased top-k + weights, one kernel per head group."""

    version = triton.__version__

    def check(self, problem: Problem) -> Sequence[Reason]:
        return device_reasons(problem.device_type)

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        return described_reasons(device)

    def __call__(self, call: RouteCall) -> tuple[torch.Tensor, torch.Tensor]:
        return fused_route(
            call.x,
            call.router_weight,
            call.bias,
            top_k=call.top_k,
            route_scale=call.route_scale,
            route_norm=call.route_norm,
            score_func=call.score_func,
        )


triton_fused_moe_route = TritonFusedMoERoute()
