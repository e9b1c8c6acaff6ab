"""Importing an FA3 build and learning its calling convention, once.

The varlen entry point is always called with keywords (positional orders differ between forks;
see docs/fa3-notes.md). Its signature is read once and tells: which keyword requests the LSE
(``return_attn_probs`` in FA3 and its PyPI forks, ``return_softmax_lse`` in later forks), whether a
``softcap`` and ``num_splits`` keyword exist, and whether native ``sinks`` exist (tokenspeed-fa3).
A build is accepted only if its C++ ops are registered in ``torch.ops.<namespace>.fwd``: MATE's
MUSA wrapper named ``flash_attn_interface`` has no ``torch.ops.flash_attn_3`` and is refused.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from magi2_backend_cuda_fa3.discovery import FoundBuild, process_builds

__all__ = ["LSE_FLAGS", "FA3Abi", "LoadResult", "load_fa3", "torch_op_exists"]

# Keywords that make a varlen call return ``(out, lse)``, in the order they are preferred.
LSE_FLAGS = ("return_attn_probs", "return_softmax_lse")


def torch_op_exists(namespace: str, name: str) -> bool:
    """Whether ``torch.ops.<namespace>.<name>`` is registered (a loaded C++ extension did it)."""
    try:
        getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return False
    return True


@dataclass(frozen=True)
class FA3Abi:
    """A loaded FA3 build: its varlen function and what its signature and build flags allow."""

    build: FoundBuild
    module: str
    varlen: Callable[..., Any]
    params: frozenset[str]
    lse_flag: str
    softcap: bool
    sinks: bool
    fp16: bool
    sm8x: bool

    @property
    def label(self) -> str:
        return f"{self.build.label} ({self.module})"

    @property
    def cc_majors(self) -> tuple[int, ...]:
        """Compute-capability majors the build runs on: Hopper, plus Ampere/Ada where SM8x is compiled in."""
        return (8, 9) if self.sm8x else (9,)


@dataclass(frozen=True)
class LoadResult:
    abi: FA3Abi | None
    attempts: tuple[str, ...]  # why each earlier candidate was not used

    def why_none(self) -> str:
        if self.attempts:
            return "; ".join(self.attempts)
        return "no FA3 build installed (fa3-fwd, flash_attn_3, tokenspeed-fa3)"


def _inspect(build: FoundBuild, module: str, varlen: Callable[..., Any]) -> FA3Abi | str:
    try:
        params = frozenset(inspect.signature(varlen).parameters)
    except (TypeError, ValueError) as exc:
        return f"{build.label}: cannot read the signature of {module}.flash_attn_varlen_func ({exc})"
    lse_flag = next((f for f in LSE_FLAGS if f in params), None)
    if lse_flag is None:
        return f"{build.label}: {module}.flash_attn_varlen_func has no LSE flag (one of {', '.join(LSE_FLAGS)})"
    return FA3Abi(
        build=build,
        module=module,
        varlen=varlen,
        params=params,
        lse_flag=lse_flag,
        softcap="softcap" in params and not build.disabled("SOFTCAP"),
        sinks="sinks" in params,
        fp16=not build.disabled("FP16"),
        sm8x=not build.disabled("SM8x"),
    )


def _load_one(build: FoundBuild) -> FA3Abi | str:
    if build.refusal is not None:
        return build.refusal
    errors: list[str] = []
    for module in build.modules:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # missing libcudart, a CPU-only torch, an ABI mismatch...
            errors.append(f"import {module}: {type(exc).__name__}: {exc}")
            continue
        varlen = getattr(mod, "flash_attn_varlen_func", None)
        if not callable(varlen):
            errors.append(f"{module} has no flash_attn_varlen_func")
            continue
        if not torch_op_exists(build.op_namespace, "fwd"):
            return (
                f"{build.label}: {module} imported but torch.ops.{build.op_namespace}.fwd is not registered "
                "(not a CUDA FA3 build: MATE's MUSA wrapper uses this module name)"
            )
        return _inspect(build, module, varlen)
    return f"{build.label}: " + "; ".join(errors)


def load_fa3(builds: tuple[FoundBuild, ...] | None = None) -> LoadResult:
    """Import the first usable build in preference order; say why each other one was skipped."""
    attempts: list[str] = []
    for build in process_builds() if builds is None else builds:
        got = _load_one(build)
        if isinstance(got, FA3Abi):
            return LoadResult(got, tuple(attempts))
        attempts.append(got)
    return LoadResult(None, tuple(attempts))
