"""Importing FlashAttention-4 and checking its calling convention, once.

``flash_attn.cute.flash_attn_varlen_func`` is called with keywords only: its fourth positional
parameter is ``qv`` (MLA), not ``cu_seqlens_q`` as in FA2/FA3. Its signature is read once and must
have every keyword the adapter passes; it always returns ``(out, lse)`` (``lse`` is ``None`` unless
``return_lse=True``).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from magi2_backend_cuda_fa4.discovery import MODULE, FA4Install, dist_version, installed

__all__ = ["REQUIRED_KEYWORDS", "FA4Abi", "LoadResult", "load_fa4"]

# Every keyword the adapter passes (flash-attn-4 4.0.0b36 has them all).
REQUIRED_KEYWORDS = (
    "q",
    "k",
    "v",
    "cu_seqlens_q",
    "cu_seqlens_k",
    "max_seqlen_q",
    "max_seqlen_k",
    "softmax_scale",
    "causal",
    "learnable_sink",
    "softcap",
    "num_splits",
    "return_lse",
)


@dataclass(frozen=True)
class FA4Abi:
    """A loaded FA4 build: its varlen function and where it came from."""

    install: FA4Install
    module: str
    varlen: Callable[..., Any]

    @property
    def label(self) -> str:
        return f"{self.install.label} ({self.module})"


@dataclass(frozen=True)
class LoadResult:
    abi: FA4Abi | None
    error: str | None = None  # why there is no abi

    def why_none(self) -> str:
        return self.error or "no error recorded"


def _shadow_hint() -> str:
    fa2 = dist_version("flash-attn")
    if fa2 is None:
        return ""
    return (
        f"; flash-attn {fa2} (FlashAttention-2) is installed too, and its regular package flash_attn "
        "hides FA4's namespace package flash_attn.cute"
    )


def load_fa4(module: str = MODULE, install: FA4Install | None = None) -> LoadResult:
    """Import FA4's interface module and check its varlen signature; say why not if it fails."""
    found = install if install is not None else installed()
    if found is None:
        return LoadResult(None, "flash-attn-4 is not installed (pip install 'magi2-core[fa4]')")
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # the CuTe DSL missing or built for another CUDA, triton absent, a shadowing FA2...
        return LoadResult(None, f"{found.label}: import {module}: {type(exc).__name__}: {exc}{_shadow_hint()}")
    varlen = getattr(mod, "flash_attn_varlen_func", None)
    if not callable(varlen):
        return LoadResult(None, f"{found.label}: {module} has no flash_attn_varlen_func")
    try:
        params = inspect.signature(varlen).parameters
    except (TypeError, ValueError) as exc:
        return LoadResult(None, f"{found.label}: cannot read the signature of {module}.flash_attn_varlen_func ({exc})")
    missing = [p for p in REQUIRED_KEYWORDS if p not in params]
    if missing:
        return LoadResult(
            None,
            f"{found.label}: {module}.flash_attn_varlen_func has no keyword(s) "
            f"{', '.join(missing)} (written against flash-attn-4 4.0.0b36)",
        )
    return LoadResult(FA4Abi(found, module, varlen))
