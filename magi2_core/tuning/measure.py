"""Timing one grid point: every eligible provider, and the plans of a provider that has them.

For a point, the inputs are built on the device and the call is resolved (that decision is recorded,
not trusted). Every installed provider of the op is then forced in turn (``provider=``): those that
can serve the call are its *eligible* providers. The eager ``reference`` is never timed: it exists to
be exact, not fast, and at production sizes it needs memory and time no measurement should spend.
A provider whose kernel object is :class:`~magi2_core.model.kernel.Planned` and can run a given plan
(``run_plan``) has each of its plan candidates timed as well, through that entry (same inputs).
Everything of one point is timed in one alternating run of the harness (:mod:`magi2_core.tools.timing`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

import magi2_core as m2
from magi2_core.errors import ResolutionError
from magi2_core.model.plan import Plan
from magi2_core.model.problem import Problem
from magi2_core.selection.registry import get_registry
from magi2_core.tools.timing import Timer, measure
from magi2_core.tuning.grid import Built, Shape

__all__ = [
    "REFERENCE",
    "PlanResult",
    "PlanRunner",
    "PointResult",
    "Prepared",
    "eligible_providers",
    "measure_point",
    "plan_fns",
    "plan_key",
    "prepare",
    "working",
]

REFERENCE = "reference"  # never timed (module docstring)


@runtime_checkable
class PlanRunner(Protocol):
    """A :class:`~magi2_core.model.kernel.Planned` kernel object that also runs a call with an explicit plan
    (the Triton MoE's ``run_plan``, taking the op's arguments after the plan)."""

    def plan(self, problem: Problem) -> Plan: ...

    def plan_candidates(self, problem: Problem) -> Sequence[Plan]: ...

    def run_plan(self, plan: Plan, *args: Any, **kwargs: Any) -> Any: ...


class PlanResult(BaseModel):
    """One plan candidate of a provider, as timed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str
    plan: Plan
    ms: dict[str, float]


class PointResult(BaseModel):
    """What one point measured: the problem, the decision found, every timed provider and plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    op: str
    problem: Problem
    resolved: str | None  # the provider the active profile chose (None: nothing could serve the call)
    eligible: tuple[str, ...]  # every provider that can serve it, the reference included when it can
    providers: dict[str, dict[str, float]]  # provider -> stats (ms) of the public call with provider=
    plans: tuple[PlanResult, ...] = ()
    errors: dict[str, str] = {}  # what raised on its first call (not timed): "provider X" / "plan X#i" -> error

    @property
    def best_provider(self) -> str | None:
        """The timed provider with the lowest median (``None``: none was timed)."""
        return min(self.providers, key=lambda p: self.providers[p]["p50"], default=None)

    def best_plan(self, provider: str) -> PlanResult | None:
        """The plan of ``provider`` with the lowest median (``None``: it has no timed plans)."""
        mine = [p for p in self.plans if p.provider == provider]
        return min(mine, key=lambda p: p.ms["p50"], default=None)


def plan_key(plan: Plan) -> tuple[str, tuple[tuple[str, int], ...], str]:
    """What makes two plans the same kernel launch (``why`` aside)."""
    return plan.variant, tuple(sorted(plan.tile.items())), plan.align


@dataclass
class Prepared:
    """A point ready to time: its inputs, resolution, eligible providers and their kernel objects."""

    shape: Shape
    built: Built
    problem: Problem
    resolved: str | None
    eligible: tuple[str, ...]
    kernels: dict[str, Any]  # eligible provider -> its kernel object


def eligible_providers(op: str, built: Built) -> tuple[tuple[str, ...], dict[str, Any]]:
    """Every installed provider of ``op`` that can serve the call (forced in turn), and their kernel objects."""
    reg = get_registry()
    names: list[str] = []
    kernels: dict[str, Any] = {}
    for loaded in reg.state().providers[op]:  # type: ignore[index]
        try:
            m2.resolve(op, *built.args, **built.kwargs, provider=loaded.name)
        except ResolutionError:
            continue
        names.append(loaded.name)
        kernels[loaded.name] = loaded.load()[0]
    return tuple(names), kernels


def prepare(shape: Shape, device: str, seed: int = 0) -> Prepared:
    """Build ``shape``'s inputs on ``device``, resolve the call and find its eligible providers."""
    built = shape.build(device, seed)
    try:
        res = m2.resolve(shape.op, *built.args, **built.kwargs)
        problem, resolved = res.problem, res.chosen
    except ResolutionError as exc:
        assert exc.resolution is not None
        problem, resolved = exc.resolution.problem, None
    eligible, kernels = eligible_providers(shape.op, built)
    return Prepared(shape=shape, built=built, problem=problem, resolved=resolved, eligible=eligible, kernels=kernels)


def plan_fns(prep: Prepared, extra: Sequence[Plan] = ()) -> dict[str, tuple[str, Plan, Callable[[], object]]]:
    """``"<provider>#<i>" -> (provider, plan, call)`` for every plan candidate of every eligible provider that
    runs explicit plans (the reference aside), plus ``extra`` plans of theirs not among the candidates."""
    out: dict[str, tuple[str, Plan, Callable[[], object]]] = {}
    args, kwargs = prep.built.args, prep.built.kwargs
    for name, kernel in prep.kernels.items():
        if name == REFERENCE or not isinstance(kernel, PlanRunner):
            continue
        plans = list(kernel.plan_candidates(prep.problem))
        seen = {plan_key(p) for p in plans}
        plans += [p for p in extra if plan_key(p) not in seen]
        for i, plan in enumerate(plans):
            out[f"{name}#{i}"] = (name, plan, _runner(kernel, plan, args, kwargs))
    return out


def _runner(kernel: PlanRunner, plan: Plan, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], object]:
    return lambda: kernel.run_plan(plan, *args, **kwargs)


def working(fns: Mapping[str, Callable[[], object]]) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """Call each function once: those that return, and what the others raised (they are not timed)."""
    ok: dict[str, Callable[[], object]] = {}
    errors: dict[str, str] = {}
    for name, fn in fns.items():
        try:
            fn()
        except Exception as exc:  # a provider that fails at this shape must not stop the run; it is reported
            errors[name] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        else:
            ok[name] = fn
    return ok, errors


def measure_point(
    shape: Shape,
    *,
    device: str,
    reps: int,
    warmup: int = 2,
    timer: Timer | None = None,
    plans: bool = True,
    seed: int = 0,
) -> PointResult:
    """Time every eligible provider of ``shape`` (and, with ``plans``, every plan candidate) in one run.

    Each is called once first; one that raises there is left out and its error kept in ``errors``."""
    prep = prepare(shape, device, seed)
    fns: dict[str, Callable[[], object]] = {
        f"provider {p}": prep.built.call(p) for p in prep.eligible if p != REFERENCE
    }
    planned = plan_fns(prep) if plans else {}
    fns.update({f"plan {key}": fn for key, (_, _, fn) in planned.items()})
    fns, errors = working(fns)
    times = measure(fns, reps, warmup=warmup, device=device, timer=timer, label=shape.id) if fns else {}
    return PointResult(
        id=shape.id,
        op=shape.op,
        problem=prep.problem,
        resolved=prep.resolved,
        eligible=prep.eligible,
        providers={p: times[f"provider {p}"] for p in prep.eligible if f"provider {p}" in times},
        plans=tuple(
            PlanResult(provider=prov, plan=plan, ms=times[f"plan {key}"])
            for key, (prov, plan, _) in planned.items()
            if f"plan {key}" in times
        ),
        errors=errors,
    )
