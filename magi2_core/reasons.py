"""Resolution records: why each candidate was or was not chosen, as values.

A :class:`Resolution` is what :func:`magi2_core.resolve` returns and what every resolution error
carries. ``explain()`` renders it for people; ``model_dump_json()`` for machines.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from magi2_core.model.problem import Problem
from magi2_core.model.virtual_device import VirtualDevice

__all__ = [
    "Candidate",
    "DecidedBy",
    "PreferenceNote",
    "ProfileNote",
    "QuarantinedPlugin",
    "Reason",
    "ReasonCode",
    "Resolution",
    "Verdict",
    "tune_advice",
]


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
    notes: tuple[str, ...] = Field(
        (),
        description="what was assumed to judge it for a described device "
        "(a library that does not import here, say); never a reason",
    )


DecidedBy = Literal["argument", "context", "env", "profile", "priority"]


class QuarantinedPlugin(BaseModel):
    """A backend entry point that could not be loaded; reported, never fatal."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    entry_point: str
    value: str
    distribution: str
    reason: str


def tune_advice(device_type: str) -> str:
    """What a reader can do about a device without measurements: ``magi2 tune`` measures GPU kernels, so
    on a CPU the advice is what a CPU user can do instead."""
    if device_type == "cpu":
        return (
            "nothing to tune on a CPU: the reference providers serve every call here (`magi2 check` "
            "verifies them); `magi2 tune` measures GPU kernels, on the GPU machine that serves the model"
        )
    return f"`magi2 tune` on a machine with this {device_type or 'device'} device measures it"


class ProfileNote(BaseModel):
    """The device profile that was active for a resolution: what it is and where it came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    source: Literal["env", "given", "user", "shipped", "generic"]
    origin: str = Field(description="the file(s) or package resources it was read from")
    device: str = Field(description="the device it was chosen for (type, name, capability)")
    provenance: str
    libraries: tuple[str, ...] = Field(
        (), description="kernel library versions it was measured with that differ from the installed ones"
    )
    why: str = Field(
        "",
        description="why the device gets this profile: what named it, or which device name "
        "and capability matched or did not",
    )
    device_type: str = Field("", description="the type of the device it was chosen for (cpu, cuda, musa, ...)")

    def lines(self) -> list[str]:
        where = {
            "env": "MAGI2_PROFILE",
            "given": "given to explain",
            "user": "user profile",
            "shipped": "shipped",
            "generic": "generic",
        }
        out = [f"profile: {self.name} ({where[self.source]}: {self.origin}; for {self.device})"]
        if self.why:
            out.append(f"  why this profile: {self.why}")
        out.append(f"  provenance: {self.provenance}")
        if self.source == "generic":
            out.append(
                "  generic profile: no measurements for this device, so the descriptors' priorities decide "
                f"where no row does; {tune_advice(self.device_type)}"
            )
        out += [f"  {note} (it still applies)" for note in self.libraries]
        return out


class PreferenceNote(BaseModel):
    """The profile's preference row that matched the call."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    when: str
    prefer: tuple[str, ...]
    why: str
    provenance: str


class Resolution(BaseModel):
    """The decision for one problem: every candidate in order, and what decided."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    problem: Problem
    candidates: tuple[Candidate, ...]
    decided_by: DecidedBy
    override: str | None = None
    chosen: str | None = None
    quarantined: tuple[QuarantinedPlugin, ...] = ()
    profile: ProfileNote | None = None
    preference: PreferenceNote | None = None  # the profile's row that matched (None: no row did)
    # the device explained for, when not this host's (magi2 explain --device-name)
    described: VirtualDevice | None = None

    @property
    def ok(self) -> bool:
        return self.chosen is not None

    def explain(self) -> str:
        p = self.problem
        asked = ", ".join(f"{k}={v}" for k, v in p.model_dump(exclude={"op", "features"}, exclude_none=True).items())
        feats = ", ".join(sorted(f.value for f in p.features)) or "none"
        lines = [f"{p.op}: {asked}; features: {feats}"]
        if self.described is not None:
            lines += self.described.lines()
        how = {
            "argument": f"forced by provider={self.override!r}",
            "context": f"forced by magi2_core.use(...) -> {self.override!r}",
            "env": f"forced by environment -> {self.override!r}",
            "profile": "the profile's preference: the first eligible of the providers it prefers",
            "priority": "first eligible in order (priority, then name)",
        }[self.decided_by]
        if self.profile is not None:
            lines += self.profile.lines()
        lines.append(f"decided by: {how}")
        pref = self.preference
        if pref is not None:
            lines.append(f"  preference {pref.id} ({pref.when}) prefers {', '.join(pref.prefer)}: {pref.why}")
            lines.append(f"    provenance: {pref.provenance}")
            if self.decided_by == "priority":
                lines.append("    none of the providers it prefers is eligible, so the next eligible one by priority")
        elif self.decided_by == "priority" and self.profile is not None:
            lines.append("  no preference of the profile matched this call")
        lines.append(f"chosen: {self.chosen or 'NONE'}")
        if p.op == "attention":
            lines.append(
                "rules see max_seqlen_q/k as the longest segment of host prefix sums; with prefix sums "
                "on the device, as the max_seqlen_* passed (the declared bound)"
            )
        for i, c in enumerate(self.candidates, 1):
            lines.append(f"  {i}. {c.provider} ({c.backend} {c.version}, priority {c.priority}): {c.verdict.value}")
            for r in c.reasons:
                lines.append(f"       - {r}")
            for note in c.notes:
                lines.append(f"       note: {note}")
        for q in self.quarantined:
            lines.append(f"  quarantined plugin {q.entry_point} ({q.distribution}): {q.reason}")
        return "\n".join(lines)
