"""Resolution records: why each candidate was or was not chosen, as values.

A :class:`Resolution` is what :func:`magi2_core.resolve` returns and what every resolution error
carries. ``explain()`` renders it for people; ``model_dump_json()`` for machines.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict

from magi2_core.problem import Problem

__all__ = ["Candidate", "DecidedBy", "QuarantinedPlugin", "Reason", "ReasonCode", "Resolution", "Verdict"]


class ReasonCode(str, Enum):
    DEVICE_TYPE = "device_type"
    DTYPE = "dtype"
    OUT_DTYPE = "out_dtype"
    HEAD_DIM = "head_dim"
    RANGE = "range"
    FEATURE = "feature"
    RULE = "rule"
    UNAVAILABLE = "unavailable"
    CHECK = "check"
    OVERRIDDEN = "overridden"
    NOT_REACHED = "not_reached"


class Reason(BaseModel):
    """One typed reason: ``field`` was ``actual`` where the provider needs ``expected``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: ReasonCode
    field: str
    expected: str
    actual: str
    detail: str = ""

    def __str__(self) -> str:
        text = f"[{self.code.value}] {self.field}: needs {self.expected}, got {self.actual}"
        return f"{text} ({self.detail})" if self.detail else text


class Verdict(str, Enum):
    CHOSEN = "chosen"
    REJECTED = "rejected"
    SKIPPED = "skipped"


class Candidate(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str
    backend: str
    version: str
    priority: int
    verdict: Verdict
    reasons: tuple[Reason, ...] = ()


DecidedBy = Literal["argument", "context", "env", "priority"]


class QuarantinedPlugin(BaseModel):
    """A backend entry point that could not be loaded; reported, never fatal."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entry_point: str
    value: str
    distribution: str
    reason: str


class Resolution(BaseModel):
    """The decision for one problem: every candidate in order, and what decided."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    problem: Problem
    candidates: tuple[Candidate, ...]
    decided_by: DecidedBy
    override: str | None = None
    chosen: str | None = None
    quarantined: tuple[QuarantinedPlugin, ...] = ()

    @property
    def ok(self) -> bool:
        return self.chosen is not None

    def explain(self) -> str:
        p = self.problem
        asked = ", ".join(f"{k}={v}" for k, v in p.model_dump(exclude={"op", "features"}, exclude_none=True).items())
        feats = ", ".join(sorted(f.value for f in p.features)) or "none"
        lines = [f"{p.op}: {asked}; features: {feats}"]
        how = {
            "argument": f"forced by provider={self.override!r}",
            "context": f"forced by magi2_core.use(...) -> {self.override!r}",
            "env": f"forced by environment -> {self.override!r}",
            "priority": "first eligible in order (rules, then priority, then name)",
        }[self.decided_by]
        lines.append(f"decided by: {how}")
        lines.append(f"chosen: {self.chosen or 'NONE'}")
        if p.op == "attention":
            lines.append("rules see max_seqlen_q/k as the longest segment of host prefix sums; with prefix sums "
                         "on the device, as the max_seqlen_* passed (the declared bound)")
        for i, c in enumerate(self.candidates, 1):
            lines.append(f"  {i}. {c.provider} ({c.backend} {c.version}, priority {c.priority}): {c.verdict.value}")
            for r in c.reasons:
                lines.append(f"       - {r}")
        for q in self.quarantined:
            lines.append(f"  quarantined plugin {q.entry_point} ({q.distribution}): {q.reason}")
        return "\n".join(lines)
