"""The learned-sink correction from a kernel's LSE (operators.md §2.3): the reference every backend matches.

Sinks are extra logits in the softmax denominator only ("keys with zero value vectors"). Given the
output ``o`` and log-sum-exp ``L [H, T]`` of attention *without* sinks::

    Ls[h]   = logsumexp_n sinks[n, h]
    L'[h,t] = logaddexp(L[h,t], Ls[h])
    δ       = L - L'            (δ not finite -> -inf, so the scale is 0)
    o'      = o · exp(δ)        (= o · sigmoid(L - Ls) where everything is finite)

Non-finite rules (bit-exact with upstream): L = -inf -> 0; Ls = +inf (a +inf sink) -> 0, with
L' = +inf; L = +inf with a finite sink -> NaN -> 0; NaN L -> 0. A -inf sink adds nothing to Ls, and
a head whose sinks are all -inf has Ls = -inf, L' = L and scale exactly 1: the call without sinks.

Rescale precision: ``"fp32"`` promotes o to FP32, multiplies by the FP32 scale and casts once (the
MUSA path of vllm-omni #7307, and the most exact); ``"activation"`` casts the scale to o's dtype and
multiplies there (the CUDA path of upstream MAGI-2).
"""

from __future__ import annotations

import torch

from magi2_core.model.kernel import SinkRescale

__all__ = ["apply_sink_correction", "sink_correction", "sink_scale"]


def sink_scale(lse: torch.Tensor, sinks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``(scale [H, T], corrected lse [H, T])`` in FP32 (FP64 for an FP64 ``lse``)."""
    acc = torch.promote_types(lse.dtype, torch.float32)
    lse = lse.to(acc)
    ls = torch.logsumexp(sinks.to(acc), dim=0)
    new_lse = torch.logaddexp(lse, ls[:, None])
    delta = lse - new_lse
    delta = torch.where(torch.isfinite(delta), delta, torch.full_like(delta, float("-inf")))
    return torch.exp(delta), new_lse


def sink_correction(
    o: torch.Tensor,
    lse: torch.Tensor,
    sinks: torch.Tensor | None,
    *,
    rescale: SinkRescale,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Apply sinks to ``o [T, H, D]`` given ``lse [H, T]``; return ``(o', lse')``.

    ``out_dtype`` defaults to o's dtype; pass it when ``o`` is an FP32 accumulator that should be
    rounded once (the exact reference does this). With no sinks, returns ``(o, lse)`` untouched
    (cast to ``out_dtype`` if given).
    """
    dtype = out_dtype or o.dtype
    if sinks is None or sinks.numel() == 0:
        return o.to(dtype), lse
    if o.dim() != 3 or lse.dim() != 2 or sinks.dim() != 2:
        raise ValueError(
            f"sink_correction: need o [T,H,D], lse [H,T], sinks [S,H]; got {list(o.shape)}, "
            f"{list(lse.shape)}, {list(sinks.shape)}"
        )
    if not (o.shape[1] == lse.shape[0] == sinks.shape[1]) or o.shape[0] != lse.shape[1]:
        raise ValueError(
            f"sink_correction: head/token counts disagree: o {list(o.shape)}, lse {list(lse.shape)}, "
            f"sinks {list(sinks.shape)}"
        )
    return _corrected(o, lse, sinks, rescale, dtype)


def _corrected(
    o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, rescale: SinkRescale, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    scale, new_lse = sink_scale(lse, sinks)
    scale_th = scale.t().unsqueeze(-1)
    if rescale == "fp32":
        out = (o.to(torch.promote_types(o.dtype, torch.float32)) * scale_th).to(dtype)
    else:
        od = o.to(dtype)
        out = od * scale_th.to(dtype)
    return out, new_lse


def apply_sink_correction(
    o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, *, rescale: SinkRescale, return_lse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The core's torch correction with the :class:`~magi2_core.sink_correction.choice.SinkCorrectionFn`
    signature: launch-only (the attention contract validated the inputs), never in place."""
    out, new_lse = _corrected(o, lse, sinks, rescale, o.dtype)
    return out, new_lse if return_lse else None
