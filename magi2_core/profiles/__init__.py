"""Device profiles: which eligible provider (and which plan) to prefer, per device, as data.

A capability descriptor says what a provider *can* serve; a profile says which of the eligible ones
to *prefer* on this device, and why, with provenance. Resolution: overrides first (``provider=`` >
``use()`` > environment), then the active profile's first matching preference row orders the
eligible providers (the listed ones first, in listed order), then priority. The file format and how
the active profile is chosen: ``docs/profiles.md``.

Public API: :class:`Profile` (and its rows :class:`Preference`, :class:`PlanRow`, its
:class:`ProfileDevice`), :func:`load_profile`, :func:`active_profile` (and :func:`profile_of` for a
:class:`DeviceKey`) -> :class:`LoadedProfile`,
:func:`user_profile_dir`, :func:`shipped_profiles`, :func:`reset_profiles`; :func:`plan_rows` (-> :class:`PlanRows`):
the plan rows a provider reads for a device, its backend's shipped rows included.
"""

from magi2_core.errors import ProfileError
from magi2_core.profiles.active import (
    GENERIC,
    DeviceKey,
    Fragment,
    LoadedProfile,
    Source,
    active_profile,
    backend_fragments,
    boundaries,
    fragment_from_resource,
    installed_version,
    profile_for,
    profile_of,
    reset_profiles,
    shipped_profiles,
    user_profile_dir,
    user_profiles,
)
from magi2_core.profiles.model import (
    FORMAT,
    VERSION,
    PlanRow,
    Preference,
    Profile,
    ProfileDevice,
    load_profile,
    loads_profile,
    parse_profile,
)
from magi2_core.profiles.plans import PlanCheck, PlanRows, every_plan_rows, plan_rows

__all__ = [
    "FORMAT",
    "GENERIC",
    "VERSION",
    "DeviceKey",
    "Fragment",
    "LoadedProfile",
    "PlanCheck",
    "PlanRow",
    "PlanRows",
    "Preference",
    "Profile",
    "ProfileDevice",
    "ProfileError",
    "Source",
    "active_profile",
    "backend_fragments",
    "boundaries",
    "every_plan_rows",
    "fragment_from_resource",
    "installed_version",
    "load_profile",
    "loads_profile",
    "parse_profile",
    "plan_rows",
    "profile_for",
    "profile_of",
    "reset_profiles",
    "shipped_profiles",
    "user_profile_dir",
    "user_profiles",
]
