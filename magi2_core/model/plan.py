"""A provider's execution plan for one problem: which kernel variant, tile and alignment serve it, and why.

A provider that chooses among kernels of its own (the Triton MoE: variants, tiles, route alignments)
exposes the choice as a :class:`Plan` through :class:`magi2_core.model.kernel.Planned`, so that
``magi2 explain`` can show it and ``magi2 tune`` can time the alternatives. The fields ``variant``,
``tile`` and ``align`` are the provider's own vocabulary; the core only shows and stores them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Plan"]


class Plan(BaseModel):
    """One way to run a call: ``variant`` (a kernel), ``tile`` (its launch sizes), ``align`` (its input
    ordering) and ``why`` (the row or rule that chose it, or the fallback that replaced it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    variant: str
    tile: dict[str, int]
    align: str
    why: str

    def describe(self) -> str:
        """One line: ``variant (K=V, ...), align A``."""
        sizes = ", ".join(f"{k}={v}" for k, v in self.tile.items())
        return f"{self.variant} ({sizes}), align {self.align}"
