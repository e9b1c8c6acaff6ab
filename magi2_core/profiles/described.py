"""Describing a device for explain (:class:`~magi2_core.model.virtual_device.VirtualDevice`) from what the caller knows.

The capability of a named device comes, in this order, from the caller, from a user, shipped or backend
profile that names the device, or from :data:`KNOWN_CAPABILITIES`; otherwise :func:`describe_device`
asks for it. Given neither a name nor a capability, it describes this host's device of the type where
it has one (so that a given profile alone explains this host's device under that profile). A given
profile is checked here, so that explain can say what is wrong with it before resolving anything.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from magi2_core import config
from magi2_core.errors import ProfileError
from magi2_core.model.devices import device_identity
from magi2_core.model.virtual_device import VirtualDevice
from magi2_core.profiles.active import GENERIC, Fragment, backend_fragments, shipped_profiles, user_profiles
from magi2_core.profiles.model import load_profile

__all__ = ["KNOWN_CAPABILITIES", "describe_device"]

# Compute capabilities of devices by the name torch reports for them (``torch.cuda.get_device_name``):
# architecture facts, for naming a device that no profile names yet without --capability.
KNOWN_CAPABILITIES: dict[str, str] = {
    "NVIDIA H100 80GB HBM3": "9.0",
    "NVIDIA H100 PCIe": "9.0",
    "NVIDIA H100 NVL": "9.0",
    "NVIDIA H200": "9.0",
    "NVIDIA H20": "9.0",
    "NVIDIA H800": "9.0",
    "NVIDIA B200": "10.0",
    "NVIDIA GB200": "10.0",
}


def describe_device(
    device_type: str,
    name: str | None = None,
    capability: str | None = None,
    profile: str | None = None,
    backends: Sequence[Fragment] | None = None,
) -> VirtualDevice:
    """A :class:`VirtualDevice`, its capability found where the caller gives none (module doc).

    ``backends``: the backends' profile fragments (default: the process registry's). Raises
    ``ValueError`` naming what is wrong and what would work: a capability that is not "major.minor", or
    a named device whose capability is not known here.
    """
    if profile is not None:
        profile = _given_profile(device_type, profile, backends)
    if name is None and capability is None:  # this host's device of that type, if it has one
        name, capability = device_identity(device_type)
        if capability is not None:
            return VirtualDevice(
                type=device_type,
                name=name,
                capability=capability,
                capability_from="this host's device",
                profile=profile,
            )
    if capability is not None:
        parts = capability.split(".")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(
                f"capability {capability!r}: give it as MAJOR.MINOR, e.g. 9.0 (Hopper) or 10.0 (Blackwell)"
            )
        return VirtualDevice(
            type=device_type, name=name, capability=capability, capability_from="given", profile=profile
        )
    if name is None:
        return VirtualDevice(type=device_type, profile=profile)
    found = _profile_capability(device_type, name, backends)
    if found is not None:
        return VirtualDevice(
            type=device_type, name=name, capability=found[0], capability_from=found[1], profile=profile
        )
    known = KNOWN_CAPABILITIES.get(name) if device_type == "cuda" else None
    if known is not None:
        return VirtualDevice(
            type=device_type, name=name, capability=known, capability_from="known device names", profile=profile
        )
    raise ValueError(
        f"{device_type} device {name!r}: its compute capability is not known here (no profile names "
        f"this device, and it is not one of the known names: {', '.join(KNOWN_CAPABILITIES)}); "
        f"give it, e.g. capability 9.0 for Hopper or 10.0 for Blackwell"
    )


def _given_profile(device_type: str, profile: str, backends: Sequence[Fragment] | None) -> str:
    """``profile`` as the profile selection takes it (a file's absolute path), checked to exist and to be
    for ``device_type``; ``ValueError`` naming what would work otherwise."""
    if profile.strip().lower() == GENERIC:
        return GENERIC
    if config.looks_like_path(profile):
        path = os.path.abspath(os.path.expanduser(profile))
        try:
            kind = load_profile(path).device.type
        except ProfileError as exc:
            raise ValueError(str(exc)) from None
        found = path
    else:
        every = (*shipped_profiles(), *(backend_fragments() if backends is None else backends))
        kinds = {f.profile.name: f.profile.device.type for f in every}
        if profile not in kinds:
            mine = sorted({GENERIC, *(n for n, k in kinds.items() if k == device_type)})
            raise ValueError(
                f"profile {profile!r}: no shipped profile has that name; shipped for {device_type}: "
                f"{', '.join(mine)}, or give a profile file (.json)"
            )
        kind, found = kinds[profile], profile
    if kind != device_type:
        raise ValueError(
            f"profile {profile!r} is for {kind} devices, not {device_type}; give a {device_type} "
            f"profile, or describe a {kind} device"
        )
    return found


def _profile_capability(device_type: str, name: str, backends: Sequence[Fragment] | None) -> tuple[str, str] | None:
    """The capability that a user, shipped or backend profile gives for the device ``name``, and which one."""
    if backends is None:
        backends = backend_fragments()
    for frag in (*user_profiles(), *shipped_profiles(), *backends):
        d = frag.profile.device
        if d.type == device_type and d.name == name and d.capability is not None:
            return d.capability, f"from profile {frag.profile.name}"
    return None
