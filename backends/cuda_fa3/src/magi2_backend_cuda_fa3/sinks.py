"""How learned sinks are applied after an FA3 call without them: which correction, as a value.

FA3 computes attention without sinks and returns the LSE; the sinks are then folded in by the
correction of operators.md §2.3. Two implementations exist: the fused Triton kernel of
``magi2-backend-triton`` (one pass over ``o`` and the LSE, in place on FA3's fresh output) and the
torch reference ``magi2_core.sinks.sink_correction`` (several launches: slower on short sequences).
:func:`select_sink_correction` picks one once and returns a :class:`SinkCorrection` that names it
and says why, so tests and benchmarks can see which one runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from magi2_core.provider import SinkRescale
from magi2_core.sinks import sink_correction

__all__ = ["TRITON_MODULE", "SinkCorrection", "select_sink_correction", "torch_correction"]

TRITON_MODULE = "magi2_backend_triton.sink_correction"

# (o [T,H,D] owned by the caller, lse [H,T] FP32, sinks [S,H] FP32, rescale, want_lse) -> (o', lse' or None)
ApplyFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, SinkRescale, bool], tuple[torch.Tensor, torch.Tensor | None]]


@dataclass(frozen=True)
class SinkCorrection:
    name: Literal["triton", "torch"]
    detail: str
    apply: ApplyFn


def _torch_apply(
    o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, rescale: SinkRescale, want_lse: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    out, new_lse = sink_correction(o, lse, sinks, rescale=rescale)
    return out, new_lse if want_lse else None


def torch_correction(detail: str) -> SinkCorrection:
    return SinkCorrection("torch", detail, _torch_apply)


def _triton_apply(fn: Callable[..., torch.Tensor]) -> ApplyFn:
    def apply(
        o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, rescale: SinkRescale, want_lse: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # o is FA3's fresh output, owned here: correct it in place (one read, one write, no allocation).
        lse_out = torch.empty_like(lse, memory_format=torch.contiguous_format) if want_lse else None
        out = fn(o, lse, sinks, rescale=rescale, out=o, lse_out=lse_out)
        return out, lse_out

    return apply


def select_sink_correction(module: str = TRITON_MODULE) -> SinkCorrection:
    """The fused Triton correction if importable with the expected keywords, else the torch one."""
    try:
        mod: Any = __import__(module, fromlist=["triton_sink_correction"])
        fn = mod.triton_sink_correction
    except Exception as exc:  # Triton absent, the backend not installed, a broken build
        return torch_correction(f"{module}.triton_sink_correction unavailable ({type(exc).__name__}: {exc})")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        return torch_correction(f"cannot read the signature of {module}.triton_sink_correction ({exc})")
    missing = [p for p in ("rescale", "out", "lse_out") if p not in params]
    if missing:
        return torch_correction(f"{module}.triton_sink_correction lacks keyword(s) {', '.join(missing)}")
    return SinkCorrection("triton", f"{module}.triton_sink_correction (fused, in place)", _triton_apply(fn))
