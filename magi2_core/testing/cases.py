"""What a conformance case is, and the small helpers the op case modules use to generate and build cases.

A :class:`Case` is a small, hashable description of one call (sizes, features, dtype, device); each
op's case module (:mod:`magi2_core.testing.op_cases`) generates its cases from a provider's descriptor
and builds a case's :class:`Call` (the tensors) from a generator seeded per case, so any case
reproduces alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from magi2_core.model.capability import Capability
from magi2_core.model.problem import OpName

__all__ = ["Call", "Case", "boundary_lengths", "clamp", "dtype_of", "make_case", "prefix_sums", "randn"]


@dataclass(frozen=True)
class Case:
    """One conformance call: ``op`` through ``provider`` on ``device`` with ``params``."""

    op: OpName
    provider: str
    device: str
    dtype: str
    label: str
    params: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def id(self) -> str:
        return f"{self.op}[{self.provider}]-{self.device}-{self.dtype}-{self.label}"

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)


def make_case(op: OpName, cap: Capability, device: str, dtype: str, label: str, params: Mapping[str, Any]) -> Case:
    return Case(op, cap.name, device, dtype, label, tuple(sorted(params.items())))


@dataclass
class Call:
    """Arguments of one public op call (without ``provider=``)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def to(self, device: str) -> Call:
        def move(v: Any) -> Any:
            return v.to(device) if isinstance(v, torch.Tensor) else v

        return Call(tuple(move(a) for a in self.args), {k: move(v) for k, v in self.kwargs.items()})

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        named = [(f"arg{i}", a) for i, a in enumerate(self.args)] + list(self.kwargs.items())
        return [(n, t) for n, t in named if isinstance(t, torch.Tensor)]

    def describe(self, names: tuple[str, ...] = ()) -> str:
        """One line per argument: tensors as dtype and shape, small index tensors with their values."""
        parts = []
        labelled = [(names[i] if i < len(names) else f"arg{i}", a) for i, a in enumerate(self.args)]
        for name, value in [*labelled, *self.kwargs.items()]:
            if isinstance(value, torch.Tensor):
                text = f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
                if value.dtype in (torch.int32, torch.int64) and value.dim() == 1 and value.numel() <= 16:
                    text += f" = {value.tolist()}"
                parts.append(f"{name}: {text}")
            elif value is not None:
                parts.append(f"{name}={value!r}")
        return ", ".join(parts)


def dtype_of(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r}")
    return dt


def randn(g: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Fresh normal draws (never zeros), made in FP64 on the CPU and rounded once to ``dtype``."""
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def prefix_sums(lengths: tuple[int, ...]) -> torch.Tensor:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def _range(cap: Capability, *fields: str) -> tuple[int, int | None]:
    """The intersection of the descriptor's ranges on ``fields`` as ``(lo, hi)``."""
    lo, hi = 0, None
    for r in cap.ranges:
        if r.field in fields:
            lo = max(lo, r.min if r.min is not None else 0)
            hi = r.max if hi is None else (hi if r.max is None else min(hi, r.max))
    return lo, hi


def clamp(value: int, cap: Capability, *fields: str) -> int:
    """``value`` moved into the descriptor's claimed ranges on ``fields``."""
    lo, hi = _range(cap, *fields)
    value = max(value, lo)
    return value if hi is None else min(value, hi)


def boundary_lengths(cap: Capability, fields: Iterable[str], max_tokens: int) -> list[int]:
    """Lengths on both sides of every range end and rule threshold on ``fields``."""
    bounds = cap.boundaries()
    out: set[int] = set()
    for f in fields:
        for b in bounds.get(f, ()):
            out.update(v for v in (b - 1, b) if 0 <= v <= max_tokens)
    return sorted(out)
