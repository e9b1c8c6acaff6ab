"""What a provider's kernel object looks like to the core.

A capability descriptor names its kernel object as ``impl = "module:attribute"``. The registry
imports it only when the provider is considered for a call. The object is called with one argument,
the op's frozen call record (``AttentionCall``, ``RouteCall``, ``ExpertsCall``, ``RMSNormCall``: the
``*Kernel`` Protocol in the op's spec, :mod:`magi2_core.ops`), and may define ``check(problem)`` for run-time availability (an optional import, a compute capability)
and cross-field limits. ``check`` must depend only on the
problem's device type, dtypes and features and on the environment, never on sizes: its answer is
cached per problem bucket. Size limits belong in the descriptor (``ranges``, ``rules``).

The record's inputs are validated and normalised by the op's spec: prefix sums are int32 on
q's device, ``max_seqlen_*`` are Python ints, ``softcap`` is ``max(softcap, 0.0)``, ``sinks`` is
``None`` or FP32 ``[S, Hq]`` with ``S >= 1``.

A kernel object that chooses among kernels of its own may also implement :class:`Planned`: its plan
for a problem (shown by ``magi2 explain``) and the alternatives ``magi2 tune`` may time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

from magi2_core.plan import Plan
from magi2_core.problem import Problem
from magi2_core.reasons import Reason

__all__ = ["Checkable", "Planned", "SinkRescale"]

SinkRescale = Literal["fp32", "activation"]


@runtime_checkable
class Checkable(Protocol):
    def check(self, problem: Problem) -> Sequence[Reason]:
        """Reasons this provider cannot serve ``problem`` here (empty: it can)."""
        ...


@runtime_checkable
class Planned(Protocol):
    """Optional on a kernel object: how it would run a problem, and what else it could run correctly."""

    def plan(self, problem: Problem) -> Plan:
        """The plan a call of ``problem`` runs here (on this host's device of ``problem.device_type``)."""
        ...

    def plan_candidates(self, problem: Problem) -> Sequence[Plan]:
        """Every plan worth timing for ``problem``, each one correct for it; the chosen plan first."""
        ...
