"""From measured points to profile rows: which provider (and plan) wins where.

Points of one op are grouped into *classes*: equal dtype, features and the sizes that are not cut on
(the head counts, head dim, expert sizes, widths). Each class is written as conditions that pin
those values (``eq``; features ``in`` / ``not_in`` for every feature some point of the op asked for),
so a row never applies to a kind of call that was not measured. Within a class, the *ordered*
fields are cut: attention by the longest key segment and then the query tokens, the MoE experts'
provider by tokens and its plan by ``routes_per_expert`` (what the plan rows read), the router and
the norm by tokens. Adjacent points with the same winner share a region; between two regions the
cut is the geometric mean of the neighbouring measured values, as an upper bound (``le``): the
last region of a class is open above and the first below, so every call of a measured class
matches one row. Classes with more conditions come first (a row that pins ``out_dtype`` is tried
before one that cannot).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from magi2_core.model.capability import Condition
from magi2_core.model.problem import OpName, with_routes_per_expert
from magi2_core.profiles.model import PlanRow, Preference
from magi2_core.tuning.measure import PointResult, plan_key

__all__ = ["CLASS_FIELDS", "ORDERED", "PLAN_ORDERED", "cut", "plan_rows", "preference_rows"]

CLASS_FIELDS: dict[str, tuple[str, ...]] = {
    "attention": ("dtype", "head_dim", "num_heads_q", "num_heads_kv"),
    "moe_experts": ("dtype", "num_heads", "num_experts", "top_k", "hidden", "intermediate"),
    "moe_route": ("dtype", "num_heads", "num_experts", "top_k", "hidden"),
    "rmsnorm": ("dtype", "out_dtype", "width", "num_modalities", "num_patterns"),
    "mhc_pre": ("dtype", "out_dtype", "num_streams", "hidden", "num_modalities"),
    "mhc_mix": ("dtype", "num_streams", "hidden"),
    "qk_norm_rope": ("dtype", "out_dtype", "num_heads", "head_dim", "rotary_dim", "num_modalities"),
    "output_gate": ("dtype", "out_dtype", "num_heads", "head_dim"),
}
ORDERED: dict[str, tuple[str, ...]] = {
    "attention": ("max_seqlen_k", "tokens"),
    "moe_experts": ("tokens",),
    "moe_route": ("tokens",),
    "rmsnorm": ("tokens",),
    "mhc_pre": ("tokens",),
    "mhc_mix": ("tokens",),
    "qk_norm_rope": ("tokens",),
    "output_gate": ("tokens",),
}
PLAN_ORDERED: dict[str, tuple[str, ...]] = {"moe_experts": ("routes_per_expert",)}


@dataclass(frozen=True)
class Cell:
    """One region of a class: its conditions and the points in it."""

    when: tuple[Condition, ...]
    points: tuple[PointResult, ...]


def _value(point: PointResult, field: str) -> int:
    v = getattr(with_routes_per_expert(point.problem), field)
    return -1 if v is None else int(v)


def cut(low: int, high: int) -> int:
    """The upper bound between two measured values: the floor of their geometric mean (``low <= cut < high``)."""
    if not 0 <= low < high:
        raise ValueError(f"cut needs 0 <= low < high; got {low}, {high}")
    return max(low, math.isqrt(low * high))


def _split(
    points: Sequence[PointResult], fields: Sequence[str], winner: Callable[[Sequence[PointResult]], Hashable]
) -> list[Cell]:
    """Nested cuts of ``points`` by ``fields`` (outer first), merging neighbours with the same winner."""
    if not fields:
        return [Cell((), tuple(points))]
    field, rest = fields[0], fields[1:]
    values = sorted({_value(p, field) for p in points})
    groups: list[tuple[list[int], list[Cell]]] = []  # (values, cells of the inner fields)
    for v in values:
        inner = _split([p for p in points if _value(p, field) == v], rest, winner)
        if (
            groups
            and len(inner) == 1
            and len(groups[-1][1]) == 1
            and winner(groups[-1][1][0].points) == winner(inner[0].points)
        ):
            vals, cells = groups[-1]
            groups[-1] = ([*vals, v], [Cell(cells[0].when, cells[0].points + inner[0].points)])
        else:
            groups.append(([v], inner))
    out: list[Cell] = []
    for i, (vals, cells) in enumerate(groups):
        last = i == len(groups) - 1
        bound = () if last else (Condition(field=field, op="le", value=cut(vals[-1], groups[i + 1][0][0])),)
        out += [Cell(bound + c.when, c.points) for c in cells]
    return out


def _class_of(point: PointResult, op: str) -> tuple[Any, ...]:
    p = point.problem
    return (tuple(getattr(p, f) for f in CLASS_FIELDS[op]), tuple(sorted(f.value for f in p.features)))


def _class_conditions(point: PointResult, op: str, features: set[str]) -> tuple[Condition, ...]:
    p = point.problem
    out = [Condition(field=f, op="eq", value=getattr(p, f)) for f in CLASS_FIELDS[op] if getattr(p, f) is not None]
    mine = {f.value for f in p.features}
    out += [Condition(field="feature", op="in" if f in mine else "not_in", value=f) for f in sorted(features)]
    return tuple(out)


def _classes(points: Sequence[PointResult], op: str) -> list[tuple[tuple[Condition, ...], list[PointResult]]]:
    mine = [p for p in points if p.op == op]
    features = {f.value for p in mine for f in p.problem.features}
    found: dict[tuple[Any, ...], list[PointResult]] = {}
    for p in mine:
        found.setdefault(_class_of(p, op), []).append(p)
    out = [(_class_conditions(ps[0], op, features), ps) for ps in found.values()]
    return sorted(out, key=lambda c: -len(c[0]))  # stable: measured order among equals


def _ranking(points: Sequence[PointResult]) -> list[str]:
    """Providers timed at every point, by the geometric mean of their time over the fastest's; then the rest."""
    everywhere = set.intersection(*(set(p.providers) for p in points))

    def score(name: str) -> float:
        return math.fsum(
            math.log(p.providers[name]["p50"] / min(v["p50"] for v in p.providers.values())) for p in points
        ) / len(points)

    ranked = sorted(everywhere, key=lambda n: (score(n), n))
    rest = sorted({n for p in points for n in p.providers} - everywhere)
    return ranked + rest


def _times(points: Sequence[PointResult], names: Sequence[str]) -> str:
    shown = [
        f"{p.id}: " + ", ".join(f"{n} {p.providers[n]['p50']:.4g} ms" for n in names if n in p.providers)
        for p in points[:3]
    ]
    more = f"; and {len(points) - 3} more points" if len(points) > 3 else ""
    return "; ".join(shown) + more


def preference_rows(points: Sequence[PointResult], ops: Sequence[OpName]) -> list[Preference]:
    """Preference rows for ``ops``: per region, the providers by measured speed (classes where at most one
    provider could be timed get none: priority already picks that one)."""
    out: list[Preference] = []
    for op in ops:
        n = 0
        for when, members in _classes(points, op):
            members = [p for p in members if p.providers]
            if not any(len(p.providers) > 1 for p in members):
                continue
            for cell in _split(members, ORDERED[op], lambda ps: _ranking(ps)[0]):
                n += 1
                prefer = _ranking(cell.points)
                out.append(
                    Preference(
                        op=op,
                        id=f"tune-{op}-{n}",
                        when=when + cell.when,
                        prefer=tuple(prefer),
                        why=f"fastest measured here by `magi2 tune`: {prefer[0]} ({_times(cell.points, prefer)})",
                    )
                )
    return out


def _best_plan(points: Sequence[PointResult], provider: str) -> tuple[str, tuple[tuple[str, int], ...], str]:
    """The plan with the lowest geometric mean of its time over each point's fastest plan (a plan not
    timed at some point of the region loses to any that was timed at all of them)."""
    keyed = [{plan_key(r.plan): r.ms["p50"] for r in p.plans if r.provider == provider} for p in points]
    every = sorted(set().union(*keyed))

    def score(key: tuple[str, tuple[tuple[str, int], ...], str]) -> tuple[int, float]:
        missing = sum(key not in k for k in keyed)
        return missing, math.fsum(math.log(k[key] / min(k.values())) for k in keyed if key in k) / len(keyed)

    return min(every, key=score)


def plan_rows(points: Sequence[PointResult], provider: str, op: OpName = "moe_experts") -> list[PlanRow]:
    """Plan rows of ``provider`` for ``op``: per region, the plan measured fastest."""
    out: list[PlanRow] = []
    n = 0
    for when, members in _classes(points, op):
        members = [p for p in members if any(r.provider == provider for r in p.plans)]
        if not members:
            continue
        for cell in _split(members, PLAN_ORDERED.get(op, ORDERED[op]), lambda ps: _best_plan(ps, provider)):
            variant, tile, align = _best_plan(cell.points, provider)
            n += 1
            shown = cell.points[:3]
            best = [
                min(
                    r.ms["p50"]
                    for r in p.plans
                    if r.provider == provider and plan_key(r.plan) == (variant, tile, align)
                )
                for p in shown
            ]
            times = "; ".join(
                f"{p.id}: {ms:.4g} ms of {sum(r.provider == provider for r in p.plans)} plans timed"
                for p, ms in zip(shown, best, strict=True)
            )
            out.append(
                PlanRow(
                    op=op,
                    provider=provider,
                    id=f"tune-{op}-{provider}-{n}",
                    when=when + cell.when,
                    plan={"variant": variant, "tile": dict(tile), "align": align},
                    why=f"the fastest plan measured here by `magi2 tune` ({times})",
                )
            )
    return out
