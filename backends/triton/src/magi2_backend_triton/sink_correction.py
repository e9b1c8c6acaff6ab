"""Fused learned-sink correction of an attention output (operators.md §2.3), one pass over ``o`` and the LSE.

A kernel without sinks returns ``o`` and ``L = log Σ_j exp(s_j)``; the sinks add ``exp(sink[n, h])``
to every row's denominator. Per (head h, token t) this kernel computes, in FP32::

    Ls    = logsumexp_n sinks[n, h]       as torch.logsumexp: m = max_n (0 if |m| = inf);
                                          log(Σ_n exp(sinks[n, h] − m)) + m, summed in n order
    L'    = logaddexp(L, Ls)              as torch's CUDA logaddexp: L if L is ±inf and L == Ls,
                                          else max(L, Ls) + log1p(exp(−|L − Ls|))
    δ     = L − L';  δ = −inf where δ is not finite
    scale = exp(δ)

i.e. the reference formula ``exp(L − logaddexp(L, Ls))`` evaluated step by step (not the equivalent
``sigmoid(L − Ls)``), so that every FP32 intermediate is the one the torch reference computes. The
transcendental calls go to libdevice (CUDA's own ``expf``/``logf``/``log1pf``) with flush-to-zero off,
which is how torch's CUDA kernels evaluate them; hence FP32-scale mode is bit-exact with the torch
reference on CUDA. Non-finite inputs follow from the formula: L = −inf → 0; Ls = +inf (a +inf sink)
→ 0 with L' = +inf; all sinks −inf → Ls = −inf, L' = L, scale 1; L = +inf with a finite sink → NaN → 0;
NaN L → 0.

Rescale precision (both as upstream):
  * ``"fp32"``: ``(o.float() · scale).to(o.dtype)``: promote, one FP32 multiply, one cast (MUSA, #7307).
  * ``"activation"``: ``o · scale.to(o.dtype)``: the scale is rounded to o's dtype and the product is
    the activation-dtype multiply (FP32 product rounded once), as the CUDA bundled path does.

Layout: ``o[T, H, D]`` (any strides), ``lse[H, T]`` FP32 natural log, ``sinks[S, H]`` FP32. Each
program takes ``BLOCK_T`` tokens of one head; the head index varies fastest across programs so that
neighbouring programs read neighbouring memory of a token-major ``o``.
"""

from __future__ import annotations

from typing import Literal

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from magi2_backend_triton.bf16 import rne_bf16
from magi2_backend_triton.interpret import interpreting

__all__ = ["apply_sink_correction", "launch_sink_correction", "triton_sink_correction"]

# INTERPRET (a constexpr, true only under TRITON_INTERPRET=1) selects the interpreter's stand-ins below.


@triton.jit
def _to_dtype(x, dtype: tl.constexpr, INTERPRET: tl.constexpr):
    if INTERPRET and dtype == tl.bfloat16:
        # The interpreter's FP32 -> BF16 cast truncates; CUDA's cvt rounds to nearest even.
        return rne_bf16(x)
    else:
        return x.to(dtype)


@triton.jit
def _to_f32(x, INTERPRET: tl.constexpr):
    if INTERPRET and x.dtype == tl.bfloat16:
        # Exact widening by bits: the interpreter's BF16 -> FP32 cast mangles subnormals.
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.float32)


@triton.jit
def _exp(x, INTERPRET: tl.constexpr):
    if INTERPRET:  # the interpreter cannot call libdevice; numpy's exp stands in
        return tl.exp(x)
    else:
        return libdevice.exp(x)


@triton.jit
def _log(x, INTERPRET: tl.constexpr):
    if INTERPRET:  # the interpreter cannot call libdevice; numpy's log stands in
        return tl.log(x)
    else:
        return libdevice.log(x)


@triton.jit
def _log1p(x, INTERPRET: tl.constexpr):
    if INTERPRET:
        # No libdevice in the interpreter: log1p(u) = log(1+u)·u/((1+u)−1) (exact where 1+u rounds to 1).
        w = 1.0 + x
        return tl.where(w == 1.0, x, tl.log(w) * (x / (w - 1.0)))
    else:
        return libdevice.log1p(x)


@triton.jit(do_not_specialize=["T"])
def _sink_correction_kernel(
    o_ptr,
    lse_ptr,
    sink_ptr,
    out_ptr,
    lse_out_ptr,
    T,
    H,
    D,
    stride_ot,
    stride_oh,
    stride_od,
    stride_lh,
    stride_lt,
    stride_sn,
    stride_sh,
    stride_yt,
    stride_yh,
    stride_yd,
    S: tl.constexpr,
    FP32_RESCALE: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    INTERPRET: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    h = pid % H
    t_blk = pid // H

    # S is a compile-time constant (1 in MAGI-2): the sink loops unroll.
    # Ls[h] exactly as torch.logsumexp(sinks, 0): inf max replaced by 0, then log(sum exp(x - m)) + m.
    m = tl.load(sink_ptr + h * stride_sh)
    for n in tl.static_range(1, S):
        m = tl.maximum(m, tl.load(sink_ptr + n * stride_sn + h * stride_sh))
    m = tl.where(tl.abs(m) == float("inf"), 0.0, m)
    acc = _exp(tl.load(sink_ptr + h * stride_sh) - m, INTERPRET)
    for n in tl.static_range(1, S):
        acc += _exp(tl.load(sink_ptr + n * stride_sn + h * stride_sh) - m, INTERPRET)
    ls = _log(acc, INTERPRET) + m

    t = t_blk.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < T
    lse = tl.load(lse_ptr + h * stride_lh + t * stride_lt, mask=t_ok, other=0.0)
    # torch's CUDA logaddexp, term for term.
    new_lse = tl.maximum(lse, ls) + _log1p(_exp(-tl.abs(lse - ls), INTERPRET), INTERPRET)
    new_lse = tl.where((tl.abs(lse) == float("inf")) & (lse == ls), lse, new_lse)
    delta = lse - new_lse
    delta = tl.where((delta == delta) & (tl.abs(delta) != float("inf")), delta, float("-inf"))
    scale = _exp(delta, INTERPRET)
    if WRITE_LSE:
        tl.store(lse_out_ptr + h * T + t, new_lse, mask=t_ok)

    d = tl.arange(0, BLOCK_D)
    mask = t_ok[:, None] & (d < D)[None, :]
    o = tl.load(o_ptr + t[:, None] * stride_ot + h * stride_oh + d[None, :] * stride_od, mask=mask)
    out_ty: tl.constexpr = out_ptr.dtype.element_ty
    if FP32_RESCALE:
        y = _to_f32(o, INTERPRET) * scale[:, None]
    else:
        # The activation-dtype product: scale rounded to o's dtype, exact FP32 product, one rounding.
        s_act = _to_f32(_to_dtype(scale, out_ty, INTERPRET), INTERPRET)
        y = _to_f32(o, INTERPRET) * s_act[:, None]
    y_off = t[:, None] * stride_yt + h * stride_yh + d[None, :] * stride_yd
    tl.store(out_ptr + y_off, _to_dtype(y, out_ty, INTERPRET), mask=mask)


def _tile(d: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_D, num_warps): 1K elements and 2 warps per program.

    H200 sweep at [T, 24, 128] BF16 (docs/rmsnorm-notes.md): 8 tokens × 2 warps was best or tied at
    every T (2.90 / 3.43 / 3.99 / 4.06 TB/s at T = 4096 / 8192 / 29202 / 32768), 32 × 4 the worst
    (2.71 / 3.28 / 3.87 / 3.93): small tiles give the small-T launches enough programs.
    """
    block_d = triton.next_power_of_2(d)
    return max(1, 1024 // block_d), block_d, 2


def triton_sink_correction(
    o: torch.Tensor,
    lse: torch.Tensor,
    sinks: torch.Tensor,
    *,
    rescale: Literal["fp32", "activation"],
    out: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply learned sinks to an attention output computed without them; returns the corrected o.

    o: ``[T, H, D]`` (BF16/FP16; FP32 works too), read once. lse: ``[H, T]`` FP32 natural-log LSE of
    the sink-free attention. sinks: ``[S, H]`` FP32 logits, never rounded. rescale: ``"fp32"``
    (``(o.float()·scale).to(o.dtype)``) or ``"activation"`` (``o·scale.to(o.dtype)``).
    out: optional ``[T, H, D]`` tensor of o's dtype to write into (may be ``o`` itself).
    lse_out: optional contiguous ``[H, T]`` FP32 tensor that receives ``L' = logaddexp(L, Ls)``.

    The scale is ``exp(L − logaddexp(L, Ls))`` with non-finite δ forced to −inf, computed the way the
    torch reference computes it (logaddexp, then subtract, in FP32); see the module docstring. With
    no sinks (``S == 0``) o is returned unchanged (copied into ``out`` when one is given).
    """
    if o.dim() != 3 or lse.dim() != 2 or sinks.dim() != 2:
        raise ValueError(
            f"expected o [T, H, D], lse [H, T], sinks [S, H]; got {tuple(o.shape)}, "
            f"{tuple(lse.shape)}, {tuple(sinks.shape)}"
        )
    n_tok, n_head, d = o.shape
    if tuple(lse.shape) != (n_head, n_tok):
        raise ValueError(f"lse must be [H, T] = {(n_head, n_tok)}; got {tuple(lse.shape)}")
    if sinks.shape[1] != n_head:
        raise ValueError(f"sinks must be [S, H] with H={n_head}; got {tuple(sinks.shape)}")
    if lse.dtype != torch.float32 or sinks.dtype != torch.float32:
        raise ValueError(f"lse and sinks must be FP32; got {lse.dtype}, {sinks.dtype}")
    if rescale not in ("fp32", "activation"):
        raise ValueError(f"rescale must be 'fp32' or 'activation'; got {rescale!r}")
    if not (o.device == lse.device == sinks.device):
        raise ValueError(f"o, lse, sinks on different devices: {o.device}, {lse.device}, {sinks.device}")
    if out is None:
        if sinks.shape[0] == 0:
            return o
        out = torch.empty((n_tok, n_head, d), dtype=o.dtype, device=o.device)
    elif out.shape != o.shape or out.dtype != o.dtype:
        raise ValueError(f"out must be {tuple(o.shape)} {o.dtype}; got {tuple(out.shape)} {out.dtype}")
    if lse_out is not None and (
        lse_out.shape != lse.shape or lse_out.dtype != torch.float32 or not lse_out.is_contiguous()
    ):
        raise ValueError(f"lse_out must be a contiguous FP32 tensor of shape {tuple(lse.shape)}")

    if sinks.shape[0] == 0:
        if out.data_ptr() != o.data_ptr():
            out.copy_(o)
        if lse_out is not None:
            lse_out.copy_(lse)
        return out
    launch_sink_correction(o, lse, sinks, rescale=rescale, out=out, lse_out=lse_out)
    return out


def apply_sink_correction(
    o: torch.Tensor,
    lse: torch.Tensor,
    sinks: torch.Tensor,
    *,
    rescale: Literal["fp32", "activation"],
    return_lse: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The fused correction as magi2-core's ``SinkCorrectionFn`` (contributed by this backend's plugin):
    launch-only, in place on ``o`` (the caller's fresh kernel output: one read, one write, no allocation)."""
    lse_out = torch.empty_like(lse, memory_format=torch.contiguous_format) if return_lse else None
    launch_sink_correction(o, lse, sinks, rescale=rescale, out=o, lse_out=lse_out)
    return o, lse_out


def launch_sink_correction(
    o: torch.Tensor,
    lse: torch.Tensor,
    sinks: torch.Tensor,
    *,
    rescale: Literal["fp32", "activation"],
    out: torch.Tensor,
    lse_out: torch.Tensor | None,
) -> None:
    """Launch the kernel on inputs that :func:`triton_sink_correction`'s checks hold for, with ``S >= 1``
    sinks and a contiguous FP32 ``lse_out`` (or ``None``). No checks: the caller validated."""
    n_tok, n_head, d = o.shape
    if o.numel() == 0:
        return
    block_t, block_d, num_warps = _tile(d)
    grid = (triton.cdiv(n_tok, block_t) * n_head,)
    _sink_correction_kernel[grid](
        o,
        lse,
        sinks,
        out,
        lse_out if lse_out is not None else lse,
        n_tok,
        n_head,
        d,
        o.stride(0),
        o.stride(1),
        o.stride(2),
        lse.stride(0),
        lse.stride(1),
        sinks.stride(0),
        sinks.stride(1),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        S=sinks.shape[0],
        FP32_RESCALE=rescale == "fp32",
        WRITE_LSE=lse_out is not None,
        INTERPRET=interpreting(),
        BLOCK_T=block_t,
        BLOCK_D=block_d,
        num_warps=num_warps,
        # libdevice without flush-to-zero, as torch's CUDA kernels: a denormal exp(δ) stays denormal.
        enable_reflect_ftz=False,
    )
