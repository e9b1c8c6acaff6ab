"""Capability descriptors: what a provider serves, as frozen, JSON-dumpable data.

A backend hands the registry one :class:`Capability` per provider. Everything the resolver needs to
accept or reject a provider for a problem is here: device types, dtypes, head dims, integer ranges,
features, priority, and :class:`Rule` objects (thresholds with provenance). The kernel itself lives
behind ``impl`` ("module:attribute") and is imported only when the provider is considered for a call.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from magi2_core.model.problem import INT_FIELDS, Feature, OpName, Problem, op_fields

__all__ = ["Capability", "CompareOp", "Condition", "IntRange", "Provenance", "Rule"]

CompareOp = Literal["lt", "le", "gt", "ge", "eq", "ne", "in", "not_in"]

_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
    "in": lambda a, b: a in b,
    "not_in": lambda a, b: a not in b,
}
_SYMBOL = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "in": "in", "not_in": "not in"}

_Frozen = ConfigDict(frozen=True, extra="forbid")


class Provenance(BaseModel):
    """Where a number came from, so that a threshold can be re-measured or challenged."""

    model_config = _Frozen

    kind: Literal["benchmark", "tune", "upstream", "hardware", "policy"]
    source: str = Field(description="a results file, a PR, a datasheet or a document section")
    note: str = ""
    date: str = Field("", description="when it was measured (ISO date), where known")
    tool: str = Field("", description="what measured it (a benchmark script, `magi2 tune`), where known")

    def __str__(self) -> str:
        when = f", {self.date}" if self.date else ""
        by = f", by {self.tool}" if self.tool else ""
        return f"{self.kind}: {self.source}{when}{by}" + (f" ({self.note})" if self.note else "")


class Condition(BaseModel):
    """``problem.<field> <op> value``; a missing (``None``) field never matches."""

    model_config = _Frozen

    field: str
    op: CompareOp
    value: int | float | str | bool | tuple[int | str, ...]

    @field_validator("field")
    @classmethod
    def _known_field(cls, name: str) -> str:
        if name not in Problem.model_fields and name != "feature":
            raise ValueError(f"unknown problem field {name!r}; known: {sorted(Problem.model_fields)}")
        return name

    @model_validator(mode="after")
    def _int_threshold(self) -> Condition:
        # An integer field compared with 20.0 or "20" would never split the resolution cache the way
        # the comparison does (the cache buckets integer fields by integer boundaries): reject it.
        values = self.value if isinstance(self.value, tuple) else (self.value,)
        if self.field in INT_FIELDS and not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            raise ValueError(
                f"{self.field!r} is an integer problem field; compare it with an int (or a tuple of "
                f"ints), not {self.value!r}"
            )
        return self

    def holds(self, problem: Problem) -> bool:
        if self.field == "feature":
            return _COMPARE[self.op](self.value, {f.value for f in problem.features})
        actual = getattr(problem, self.field)
        if actual is None:
            return False
        return _COMPARE[self.op](actual, self.value)

    def boundaries(self) -> tuple[int, ...]:
        """Integer values at which this condition can change its truth (for cache bucketing)."""
        if self.field not in INT_FIELDS:
            return ()
        values = self.value if isinstance(self.value, tuple) else (self.value,)
        out: list[int] = []
        for v in values:
            assert isinstance(v, int)  # enforced by _int_threshold
            out += [v, v + 1]
        return tuple(out)

    def __str__(self) -> str:
        return f"{self.field} {_SYMBOL[self.op]} {self.value!r}"


class Rule(BaseModel):
    """A provider-specific threshold: when every condition holds, the provider is ineligible."""

    model_config = _Frozen

    id: str = Field(description="stable name, shown by explain(), e.g. 'mate-short-sequence'")
    when: tuple[Condition, ...]
    reason: str
    provenance: Provenance

    def fires(self, problem: Problem) -> bool:
        return all(c.holds(problem) for c in self.when)

    def describe(self) -> str:
        return " and ".join(str(c) for c in self.when)


class IntRange(BaseModel):
    """Inclusive bounds on an integer problem field (``None`` = unbounded)."""

    model_config = _Frozen

    field: str
    min: int | None = None
    max: int | None = None

    @field_validator("field")
    @classmethod
    def _int_field(cls, name: str) -> str:
        if name not in INT_FIELDS:
            raise ValueError(f"{name!r} is not an integer problem field; known: {list(INT_FIELDS)}")
        return name

    def contains(self, value: int) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def __str__(self) -> str:
        lo = "-inf" if self.min is None else str(self.min)
        hi = "inf" if self.max is None else str(self.max)
        return f"[{lo}, {hi}]"


class Capability(BaseModel):
    """What one provider of one operator serves. Frozen; ``model_dump_json()`` gives the listing."""

    model_config = _Frozen

    op: OpName
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="provider name, unique per op")
    impl: str = Field(pattern=r"^[\w.]+:[\w.]+$", description="'module:attribute' of the kernel object")
    version: str = Field("", description="provider version; defaults to the backend's version")
    backend: str = Field("", description="distribution that provides it; set by the registry")
    device_types: tuple[str, ...] = Field(description="torch device types served; '*' = any")
    dtypes: tuple[str, ...]
    out_dtypes: tuple[str, ...] | None = None
    head_dims: tuple[int, ...] | None = None
    ranges: tuple[IntRange, ...] = ()
    features: frozenset[Feature] = frozenset()
    priority: int = 0
    rules: tuple[Rule, ...] = ()
    description: str = ""

    def named_fields(self) -> list[tuple[str, str]]:
        """``(where, problem field)`` for every problem field this descriptor constrains: what must exist
        on its op's problem for the constraint to ever matter (checked when the backend loads)."""
        out = [(f"ranges[{i}]", r.field) for i, r in enumerate(self.ranges)]
        out += [(f"rules[{rule.id!r}]", c.field) for rule in self.rules for c in rule.when]
        if self.head_dims is not None:
            out.append(("head_dims", "head_dim"))
        if self.out_dtypes is not None:
            out.append(("out_dtypes", "out_dtype"))
        return out

    def boundaries(self) -> dict[str, set[int]]:
        """Integer values of each field at which this descriptor's verdict can change."""
        out: dict[str, set[int]] = {}
        for r in self.ranges:
            b = out.setdefault(r.field, set())
            if r.min is not None:
                b.add(r.min)
            if r.max is not None:
                b.add(r.max + 1)
        if self.head_dims is not None:
            out.setdefault("head_dim", set()).update(h + d for h in self.head_dims for d in (0, 1))
        for rule in self.rules:
            for c in rule.when:
                if c.field in INT_FIELDS:
                    out.setdefault(c.field, set()).update(c.boundaries())
        return out


def descriptor_errors(cap: Capability) -> list[str]:
    """Why ``cap`` cannot be a descriptor of its op: each field it names that the op's problem lacks
    (such a range or rule would silently never fire). Empty: it is consistent."""
    known = op_fields(cap.op)
    return [
        f"{where} names {name!r}, which {cap.op} does not have (its fields: {sorted(known - {'op'})})"
        for where, name in cap.named_fields()
        if name not in known
    ]
