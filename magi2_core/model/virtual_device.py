"""A device described rather than present: what ``magi2 explain --device-name`` resolves for.

Explaining for a :class:`VirtualDevice` answers "what would that device pick?" on a host without it
(a laptop, CI): the profile is chosen for its name and capability as on that device, and providers
are judged on its capability rather than on this host's devices. Their libraries are assumed to be
installed as on that device: a provider whose library does not import here says so in a note on its
candidate, and is judged as its usual build would be (:class:`magi2_core.model.kernel.CheckableOn`).

Only explain takes a virtual device (:func:`magi2_core.selection.resolver.resolve_problem`'s ``device=``); a
call of an op never does, so the resolution of real calls is the same with or without this module.

:func:`magi2_core.profiles.described.describe_device` builds one from what the caller knows (a name
alone, say), finding the capability.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["VirtualDevice"]


class VirtualDevice(BaseModel):
    """A described device: ``type`` (torch device type), ``name`` (as torch would report it),
    ``capability`` ("major.minor"), where the capability came from, and ``profile``: a profile named as
    ``MAGI2_PROFILE`` names one (a file, ``generic`` or a shipped name), used in its place (None:
    the profile is chosen as on that device)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str = Field(min_length=1)
    name: str | None = Field(None, min_length=1)
    capability: str | None = Field(None, pattern=r"^\d+\.\d+$")
    capability_from: str = Field("", description="given, a profile that names the device, or known device names")
    profile: str | None = Field(None, min_length=1)

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """``(major, minor)``, or None where unknown."""
        if self.capability is None:
            return None
        major, minor = self.capability.split(".")
        return int(major), int(minor)

    def __str__(self) -> str:
        name = f" {self.name}" if self.name else " (no device name)"
        if self.capability is None:
            return f"{self.type}{name}"
        origin = f", {self.capability_from}" if self.capability_from else ""
        return f"{self.type}{name} (capability {self.capability}{origin})"

    def lines(self) -> list[str]:
        """What ``explain()`` says about the device and the assumptions it made."""
        forced = f"; profile {self.profile!r} given in place of MAGI2_PROFILE" if self.profile else ""
        return [
            f"device: {self} - described, not this host's{forced}",
            "  providers are judged on its capability, with their libraries assumed installed as on that "
            "device (a note names any that does not import here); this host's environment applies",
        ]
