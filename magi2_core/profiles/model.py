"""The device-profile file: plain, versioned JSON, validated into frozen pydantic models.

A profile says, for one device, which eligible provider to prefer per op and region of the problem
space (``preferences``) and which plan a provider should run (``plans``, opaque to the core), each
row with its ``why`` and its provenance. Conditions are :class:`~magi2_core.model.capability.Condition`
values, evaluated on the call's :class:`~magi2_core.model.problem.Problem`; rows are tried in file order
and the first whose conditions all hold wins. The format is described in ``docs/profiles.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator, model_validator

from magi2_core.errors import ProfileError
from magi2_core.model.capability import Condition, Provenance
from magi2_core.model.problem import INT_FIELDS, OpName, Problem, op_fields

__all__ = ["FORMAT", "VERSION", "PlanRow", "Preference", "Profile", "ProfileDevice", "load_profile", "parse_profile"]

FORMAT = "magi2-profile"
VERSION = 1

_Frozen = ConfigDict(frozen=True, extra="forbid")


class ProfileDevice(BaseModel):
    """The device a profile was measured on: torch device type, device name and compute capability.

    ``name`` is what ``torch.cuda.get_device_name()`` (or the MUSA equivalent) says; a profile without
    one is a *generic* fragment for its device type (and capability, when given: ``"9"`` covers every 9.x).
    """

    model_config = _Frozen

    type: str = Field(min_length=1, description="torch device type: cuda, musa, cpu, ...")
    name: str | None = Field(None, min_length=1, description="the device's name as torch reports it")
    capability: str | None = Field(
        None,
        pattern=r"^\d+(\.\d+)?$",
        description="compute capability: 'major.minor', "
        "or 'major' alone in a generic fragment (every minor of that major)",
    )

    @model_validator(mode="after")
    def _major_only_is_generic(self) -> ProfileDevice:
        if self.name is not None and self.capability is not None and "." not in self.capability:
            raise ValueError(
                f"capability {self.capability!r}: a profile measured on a named device gives "
                f"'major.minor' (a major alone is for a generic fragment)"
            )
        return self

    def covers(self, capability: str | None) -> bool:
        """Does this device's capability (None: any) include ``capability`` ('major' alone: every minor of it)?"""
        if self.capability is None:
            return True
        if capability is None:
            return False
        return capability == self.capability or (
            "." not in self.capability and capability.split(".")[0] == self.capability
        )


def _matches(when: tuple[Condition, ...], problem: Problem) -> bool:
    return all(c.holds(problem) for c in when)


class Preference(BaseModel):
    """For calls of ``op`` where every ``when`` condition holds: try the ``prefer`` providers first."""

    model_config = _Frozen

    op: OpName
    id: str = Field("", description="a stable name shown by explain(); default: the row's position")
    when: tuple[Condition, ...] = ()
    prefer: tuple[str, ...] = Field(min_length=1, description="provider names, most preferred first")
    why: str = Field(min_length=1)
    provenance: Provenance | None = Field(None, description="default: the profile's provenance")

    def matches(self, problem: Problem) -> bool:
        return problem.op == self.op and _matches(self.when, problem)

    def describe(self) -> str:
        return " and ".join(str(c) for c in self.when) or "every call"


class PlanRow(BaseModel):
    """For calls of ``op`` served by ``provider`` where every ``when`` condition holds: run ``plan``.

    ``plan`` is opaque to the core: the provider that owns it interprets it.
    """

    model_config = _Frozen

    op: OpName
    provider: str = Field(min_length=1)
    id: str = ""
    when: tuple[Condition, ...] = ()
    plan: Mapping[str, JsonValue]
    why: str = Field(min_length=1)
    provenance: Provenance | None = None

    def matches(self, problem: Problem) -> bool:
        return problem.op == self.op and _matches(self.when, problem)


class Profile(BaseModel):
    """One profile file (or fragment): the device it describes and its preference and plan rows."""

    model_config = _Frozen

    format: Literal["magi2-profile"]
    version: Literal[1]
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    device: ProfileDevice
    libraries: Mapping[str, str] = Field(
        default_factory=dict, description="distribution -> version (major.minor) the measurements used"
    )
    provenance: Provenance
    preferences: tuple[Preference, ...] = ()
    plans: tuple[PlanRow, ...] = ()

    @field_validator("libraries")
    @classmethod
    def _versions(cls, libs: Mapping[str, str]) -> Mapping[str, str]:
        bad = {k: v for k, v in libs.items() if not v.strip()}
        if bad:
            raise ValueError(f"empty versions for {sorted(bad)}")
        return libs

    def preference_for(self, problem: Problem) -> Preference | None:
        """The first preference row that matches ``problem`` (``None``: priority decides)."""
        return next((row for row in self.preferences if row.matches(problem)), None)

    def plans_for(self, op: OpName, provider: str, problem: Problem | None = None) -> tuple[PlanRow, ...]:
        """The plan rows of ``provider`` for ``op``, in file order; with ``problem``, only those that match
        it (the first of them is the one that applies)."""
        return tuple(
            r for r in self.plans if r.op == op and r.provider == provider and (problem is None or r.matches(problem))
        )

    def plan_for(self, op: OpName, provider: str, problem: Problem) -> PlanRow | None:
        """The plan row that applies to ``problem`` on ``provider`` (``None``: no row matches)."""
        return next(iter(self.plans_for(op, provider, problem)), None)

    def boundaries(self) -> dict[OpName, dict[str, set[int]]]:
        """Per op, the integer values of each field at which a row's match can change (cache buckets)."""
        out: dict[OpName, dict[str, set[int]]] = {}
        rows: tuple[Preference | PlanRow, ...] = (*self.preferences, *self.plans)
        for row in rows:
            for c in row.when:
                if c.field in INT_FIELDS:
                    out.setdefault(row.op, {}).setdefault(c.field, set()).update(c.boundaries())
        return out


def _field_errors(profile: Profile) -> list[str]:
    """Preference conditions naming a problem field their op does not have (they would never match).

    Plan rows are read by their provider, which may evaluate them on fields it derives (the Triton MoE
    fills ``routes_per_expert``): any problem field is accepted there (``Condition`` checks that).
    """
    out = []
    for i, row in enumerate(profile.preferences):
        known = op_fields(row.op) - {"op"}
        out += [
            f"preferences[{i}].when: {c.field!r} is not a field of {row.op} problems (known: {sorted(known)})"
            for c in row.when
            if c.field not in known
        ]
    return out


def parse_profile(data: Any, origin: str) -> Profile:
    """Validate ``data`` (a decoded JSON object) as a profile; :class:`ProfileError` names ``origin`` and
    the field that is wrong."""
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()
        )
        raise ProfileError(origin, problems) from None
    wrong = _field_errors(profile)
    if wrong:
        raise ProfileError(origin, "; ".join(wrong))
    return profile


def load_profile(path: str | Path) -> Profile:
    """Read and validate one profile file."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(where, f"cannot read it: {exc.strerror or exc}") from None
    return loads_profile(text, where)


def loads_profile(text: str, origin: str) -> Profile:
    """Decode and validate a profile's JSON text (``origin`` names it in errors)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProfileError(origin, f"not JSON: {exc}") from None
    return parse_profile(data, origin)
