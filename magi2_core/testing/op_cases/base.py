"""What an op's conformance cases provide: the kit (:mod:`magi2_core.testing`) loops over these.

The cases of an op live beside the kit, not in the op's hot-path module (:mod:`magi2_core.ops`): the
production ops never import the test kit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

import torch

from magi2_core.model.capability import Capability
from magi2_core.model.problem import OpName, Problem
from magi2_core.testing.cases import Call, Case

__all__ = ["OpCases", "out_dtypes"]


class OpCases(ABC):
    """The conformance cases of one operator, their problems, inputs and output layouts."""

    op: OpName

    @abstractmethod
    def cases(self, cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
        """The conformance cases of ``cap`` on ``device`` (ranges are filtered by the caller)."""

    @abstractmethod
    def case_problem(self, case: Case) -> Problem:
        """The :class:`Problem` the op will build for ``case`` (what selection sees), without tensors."""

    @abstractmethod
    def build(self, case: Case, g: torch.Generator) -> Call:
        """The case's arguments on the CPU, drawn from ``g``."""

    @abstractmethod
    def layout(self, call: Call) -> dict[str, tuple[list[int], tuple[torch.dtype, ...]]]:
        """Each output's contract shape and allowed dtypes for the public call ``call``."""

    @abstractmethod
    def invalid_calls(self, dtype: torch.dtype, other: torch.dtype, g: torch.Generator) -> dict[str, Call]:
        """Calls the op must reject with an input error, by what is wrong with them (``other``: a
        floating dtype that is not ``dtype``)."""


def out_dtypes(cap: Capability, dtype: str) -> list[str | None]:
    """The ``out_dtype`` values the cases of an op with an out dtype try for inputs of ``dtype``:
    ``None`` (the input's dtype) where ``cap`` claims it, then every other claimed out dtype (FP32 where
    the descriptor does not restrict them)."""
    claimed = cap.out_dtypes if cap.out_dtypes is not None else ("float32",)
    outs: list[str | None] = [None] if cap.out_dtypes is None or dtype in cap.out_dtypes else []
    return outs + [o for o in claimed if o != dtype]
