"""One exception family for everything magi2-core raises.

Input errors name the argument, what was expected and what was given, so that the message alone
says how to fix the call. Resolution errors carry the :class:`~magi2_core.reasons.Resolution`
that explains every candidate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from magi2_core.reasons import Resolution

__all__ = [
    "ConfigChangeError",
    "ConfigError",
    "InvalidDTypeError",
    "InvalidDeviceError",
    "InvalidInputError",
    "InvalidValueError",
    "InvalidShapeError",
    "Magi2Error",
    "NoEligibleProviderError",
    "ProfileError",
    "ProviderNotEligibleError",
    "ResolutionError",
    "StrictModeError",
    "UnknownProviderError",
]


class Magi2Error(Exception):
    """Base class of every error raised by magi2-core."""


class InvalidInputError(Magi2Error):
    """An argument of an operator call is wrong; ``arg``, ``expected`` and ``actual`` say how."""

    def __init__(self, op: str, arg: str, expected: str, actual: str) -> None:
        self.op = op
        self.arg = arg
        self.expected = expected
        self.actual = actual
        super().__init__(f"{op}: argument '{arg}' must be {expected}; got {actual}")


class InvalidValueError(InvalidInputError, ValueError):
    """A value outside what the call accepts (an option, a scale, an op name)."""


class InvalidShapeError(InvalidValueError):
    """Wrong rank, size, or inconsistent sizes/values (prefix sums, modality sizes, top_k)."""


class InvalidDTypeError(InvalidInputError, TypeError):
    """Wrong dtype."""


class InvalidDeviceError(InvalidValueError):
    """Tensors of one call on different devices."""


class ResolutionError(Magi2Error, RuntimeError):
    """No provider could be resolved; ``resolution.explain()`` says why for each candidate."""

    def __init__(self, message: str, resolution: Resolution | None = None) -> None:
        self.resolution = resolution
        detail = f"\n\n{resolution.explain()}" if resolution is not None else ""
        super().__init__(message + detail)


class NoEligibleProviderError(ResolutionError):
    """Every installed provider of the operator rejected the call."""


class UnknownProviderError(ResolutionError, ValueError):
    """An override named a provider that is not installed for this operator."""


class ProviderNotEligibleError(ResolutionError):
    """An override forced a provider that cannot serve this call."""


class StrictModeError(ResolutionError):
    """Strict mode is on and an accelerator call resolved to the eager reference provider."""


class ConfigError(Magi2Error, ValueError):
    """A ``MAGI2_*`` environment variable has a value its parser rejects; ``variable``, ``value``, ``accepted``."""

    def __init__(self, variable: str, value: str, accepted: str, why: str = "") -> None:
        self.variable, self.value, self.accepted = variable, value, accepted
        detail = f" ({why})" if why else ""
        super().__init__(f"{variable}={value!r} is not valid{detail}; accepted: {accepted}")


class ConfigChangeError(ConfigError):
    """A ``MAGI2_*`` variable changed after the moment it is read, and the value read then stays in use.

    ``variable``, ``value`` (the new text, None when unset), ``moment``, ``in_use`` (the value kept).
    """

    def __init__(self, variable: str, value: str | None, moment: str, in_use: object, remedy: str) -> None:
        self.variable, self.value, self.accepted = variable, value or "", ""
        self.moment, self.in_use = moment, in_use
        now = "unset" if value is None else f"set to {value!r}"
        Magi2Error.__init__(
            self,
            f"{variable} was {now} after it was read at {moment}; {in_use!r} stays in use "
            f"and the change cannot take effect: {remedy}",
        )


class ProfileError(Magi2Error, ValueError):
    """A device-profile file (or a backend's fragment) is not a valid profile; ``origin`` names it."""

    def __init__(self, origin: str, why: str) -> None:
        self.origin, self.why = origin, why
        super().__init__(f"profile {origin}: {why}; see docs/profiles.md for the format")
