"""What a backend distribution declares: its :class:`BackendSpec`, the one thing its entry point returns.

A backend registers a function under the entry-point group ``magi2_core.backends``
(``name = "package.plugin:magi2_backend"``). The registry calls it once, with no arguments, and it
returns the whole :class:`BackendSpec`: the providers' descriptors, the learned-sink corrections it
contributes (:class:`SinkCorrectionSpec`), the ``MAGI2_*`` variables it reads (:class:`Setting`) and
its device-profile fragments. It must be cheap: descriptors only, no kernel imports.

There are no hooks: each backend is described by one call, on its own, so a plain function does what
pluggy did here (docs/writing-a-backend.md, "Why a plain function"). :data:`hookimpl` survives as a
marker that does nothing, so that a plugin written for pluggy still imports: one whose only hook is
``magi2_backend`` loads, one with a ``magi2_sink_corrections`` hook is quarantined with a reason that
says what to change, instead of failing on ``ImportError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal, TypeVar, overload

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from magi2_core.model.capability import Capability

__all__ = ["BackendSpec", "Setting", "SettingKind", "SettingMoment", "SinkCorrectionSpec", "hookimpl"]

SettingKind = Literal["boolean", "choice", "fraction", "seconds"]
SettingMoment = Literal["every call", "backend load", "plugin load"]


class Setting(BaseModel):
    """One ``MAGI2_*`` environment variable that a backend reads, declared in its :class:`BackendSpec`.

    The registry adds it to :mod:`magi2_core.config` when the backend loads, with the backend's name
    as its owner (``docs/configuration.md`` lists it so). It is then parsed, cached, validated and
    re-read like the core's own variables: ``magi2_core.config.get(name)`` returns the parsed value as
    ``os.environ`` holds it now; ``read`` says when the backend reads it (docs/configuration.md). A name
    that the core or another backend already declares quarantines
    the backend that comes second.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^MAGI2_[A-Z0-9_]+$", description="the variable, e.g. 'MAGI2_MATE_BACKEND'")
    kind: SettingKind = Field(
        description="how the value parses: boolean (1/true/yes/on, 0/false/no/off), "
        "choice (one of `choices`), fraction (in [0, 1]), seconds (>= 0)"
    )
    default: StrictBool | float | str | None = Field(None, description="the value when unset (None: unset)")
    choices: tuple[str, ...] = Field((), description="the accepted values of a 'choice' setting, lower case")
    help: str = Field(min_length=1, description="what it does, for docs/configuration.md")
    read: SettingMoment = Field(
        "every call",
        description="when the backend reads it: 'every call' (config.get at each use; a change takes effect at the "
        "next call) or 'backend load' (read once when the backend loads and kept; a later change is "
        "refused with ConfigChangeError until reload_config() reloads the backends); 'plugin load' is "
        "the vLLM plugin's own",
    )
    forces_sink_correction_on: str | None = Field(
        None,
        description="a device type: this 'choice' setting names the learned-sink correction used on that "
        "device type (its choices are correction names; 'torch' is the core's own)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Setting:
        if self.kind == "choice":
            if not self.choices:
                raise ValueError(f"{self.name}: a 'choice' setting lists its choices")
            odd = [c for c in self.choices if not c or c != c.strip().lower()]
            if odd:
                raise ValueError(f"{self.name}: choices are matched in lower case without spaces; {odd} never match")
            if self.default is not None and self.default not in self.choices:
                raise ValueError(f"{self.name}: default {self.default!r} is not one of {list(self.choices)}")
            return self
        if self.choices:
            raise ValueError(f"{self.name}: only a 'choice' setting has choices (this one is {self.kind!r})")
        if self.forces_sink_correction_on is not None:
            raise ValueError(f"{self.name}: a setting that forces a sink correction is a 'choice' of correction names")
        if self.default is None:
            return self
        if self.kind == "boolean" and not isinstance(self.default, bool):
            raise ValueError(f"{self.name}: a boolean setting's default is True, False or None")
        if self.kind in ("fraction", "seconds"):
            number = self.default
            if isinstance(number, (bool, str)) or not math.isfinite(number):
                raise ValueError(f"{self.name}: a {self.kind} setting's default is a finite number or None")
            if number < 0.0 or (self.kind == "fraction" and number > 1.0):
                raise ValueError(f"{self.name}: default {number} is outside what a {self.kind} setting accepts")
        return self


class SinkCorrectionSpec(BaseModel):
    """A learned-sink correction that a backend contributes: data only, its kernel imported on first use.

    ``impl`` names a callable with the :class:`magi2_core.sink_correction.choice.SinkCorrectionFn` signature.
    For a device type the core picks the highest-``priority`` correction that lists it in
    ``device_types`` (the core's torch correction, priority 0, serves every device type).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="unique among all backends, e.g. 'triton'")
    impl: str = Field(pattern=r"^[\w.]+:[\w.]+$", description="'module:attr' of the correction callable")
    device_types: tuple[str, ...] = Field(min_length=1, description="device types it is picked for by priority")
    priority: int = 0
    description: str = ""
    backend: str = Field("", description="filled in by the registry")


class BackendSpec(BaseModel):
    """A backend distribution: its providers, the core contract range it implements, and what it brings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="distribution name, e.g. 'magi2-backend-triton'")
    version: str
    core_api: str = Field(description="PEP 440 specifier of supported core contract versions, e.g. '>=2.0,<3'")
    providers: tuple[Capability, ...]
    description: str = ""
    profiles: tuple[str, ...] = Field(
        (),
        description="device-profile fragments this backend ships, as 'package:path/file.json' package-data "
        "resources (docs/profiles.md); read and validated when the backend loads",
    )
    sink_corrections: tuple[SinkCorrectionSpec, ...] = Field(
        (), description="learned-sink corrections this backend contributes (magi2_core.sink_correction.choice)"
    )
    settings: tuple[Setting, ...] = Field(
        (), description="the MAGI2_* variables this backend reads, declared in magi2_core.config while it is loaded"
    )


F = TypeVar("F", bound=Callable[..., Any])


@overload
def hookimpl(function: F, /) -> F: ...
@overload
def hookimpl(function: None = None, /, **options: object) -> Callable[[F], F]: ...
def hookimpl(function: F | None = None, /, **options: object) -> F | Callable[[F], F]:
    """Deprecated and inert: returns ``function`` unchanged (``@hookimpl`` and ``@hookimpl(...)`` both work).

    Kept so that a plugin written for the pluggy hooks still imports (the registry loads its
    ``magi2_backend``, or quarantines it with what to change if it has a ``magi2_sink_corrections`` hook).
    A backend written for this core does not need it.
    """
    if function is None:
        return lambda fn: fn
    return function
