"""What a provider's kernel object looks like to the core.

A capability descriptor names its kernel object as ``impl = "module:attribute"``. The registry
imports it only when the provider is considered for a call. The object is called with one argument,
the op's frozen call record (``AttentionCall``, ``RouteCall``, ``ExpertsCall``, ``RMSNormCall``: the
``*Kernel`` Protocol in the op's spec, :mod:`magi2_core.ops`), and may define ``check(problem)`` for
run-time availability (an optional import, a compute capability) and cross-field limits. ``check`` must
depend only on the problem's device type, dtypes and features and on the environment, never on sizes: its
answer is cached per problem bucket. Size limits belong in the descriptor (``ranges``, ``rules``).

The record's inputs are validated and normalised by the op's spec: prefix sums are int32 on
q's device, ``max_seqlen_*`` are Python ints, ``softcap`` is ``max(softcap, 0.0)``, ``sinks`` is
``None`` or FP32 ``[S, Hq]`` with ``S >= 1``.

A kernel object that chooses among kernels of its own may also implement :class:`Planned`: its plan
for a problem (shown by ``magi2 explain``) and the alternatives ``magi2 tune`` may time.

For ``magi2 explain`` on a described device (:class:`~magi2_core.model.virtual_device.VirtualDevice`, one this
host may not have), a kernel object may implement :class:`CheckableOn` and :class:`PlannedOn`: the same
answers for that device, judged on its capability, with the provider's libraries assumed installed as on
that device. Only explain calls them. Without ``check_on``, explain calls ``check`` and sets aside the
reason that :func:`magi2_core.model.devices.absent_device` gives (this host lacks the device), saying so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple, Protocol, runtime_checkable

from magi2_core.model.plan import Plan
from magi2_core.model.problem import Problem
from magi2_core.model.virtual_device import VirtualDevice
from magi2_core.reasons import Reason

__all__ = ["Checkable", "CheckableOn", "CheckedOn", "Planned", "PlannedOn", "SinkRescale"]

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


class CheckedOn(NamedTuple):
    """A provider's verdict on a described device: ``reasons`` it could not serve the problem there
    (empty: it could) and ``assumed``: what it took for granted to say so (its library does not import
    here, and which build was assumed)."""

    reasons: tuple[Reason, ...] = ()
    assumed: tuple[str, ...] = ()


@runtime_checkable
class CheckableOn(Protocol):
    """Optional on a kernel object: ``check`` for a described device instead of this host's (module doc)."""

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        """Could this provider serve ``problem`` on ``device``, its libraries installed as on that device?"""
        ...


@runtime_checkable
class PlannedOn(Protocol):
    """Optional on a kernel object: ``plan`` for a described device instead of this host's (module doc)."""

    def plan_on(self, problem: Problem, device: VirtualDevice) -> Plan:
        """The plan a call of ``problem`` would run on ``device`` (its profile: ``device.profile`` if given)."""
        ...
