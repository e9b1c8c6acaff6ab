"""magi2-core: contracts, registry and resolver for the MAGI-2 operators.

>>> import magi2_core as m2
>>> m2.resolve  # doctest: +ELLIPSIS
<function resolve at ...>
"""

# ruff: noqa: F405 (the public names come from _api: star-imported for type checkers, lazily at run time)
from typing import TYPE_CHECKING, Any

from magi2_core._version import CORE_API_VERSION, __version__

if TYPE_CHECKING:  # the names below, for type checkers; at run time they load on first use
    from magi2_core._api import *  # noqa: F403

# The public surface (docs/api.md): what users and backend authors call. Everything else is imported
# from its submodule (e.g. ``magi2_core.reasons.ReasonCode``; a backend's names from ``magi2_core.backend``).
__all__ = [
    "CORE_API_VERSION",
    "__version__",
    # the operators
    "attention",
    "mhc_mix",
    "mhc_pre",
    "moe_experts",
    "moe_route",
    "output_gate",
    "prepare_moe_weights",
    "qk_norm_rope",
    "PreparedMoEWeights",
    "rmsnorm",
    # resolution and run-time control
    "Resolution",
    "reload_config",
    "resolve",
    "set_device_value_checks",
    "set_strict",
    "shadow",
    "use",
    # errors
    "ConfigChangeError",
    "ConfigError",
    "InvalidDTypeError",
    "InvalidDeviceError",
    "InvalidInputError",
    "InvalidShapeError",
    "InvalidValueError",
    "Magi2Error",
    "NoEligibleProviderError",
    "ProviderNotEligibleError",
    "ResolutionError",
    "StrictModeError",
    "UnknownProviderError",
    # for backend authors
    "BackendSpec",
    "Capability",
    "Condition",
    "Feature",
    "IntRange",
    "Problem",
    "Rule",
    "Setting",
    "SinkCorrectionSpec",
    "get_registry",
    "hookimpl",  # deprecated, inert: kept so that pluggy-era plugins import and are told what to change
]


def __getattr__(name: str) -> Any:
    """Import the public API on first use of any of its names (PEP 562).

    ``import magi2_core`` alone imports neither torch nor pydantic, so ``magi2 --help`` and the
    auto-loaded pytest plugin stay cheap; the first ``m2.<name>`` loads every public name at once.
    """
    if name not in __all__:
        raise AttributeError(f"module 'magi2_core' has no attribute {name!r}")
    from magi2_core import _api

    namespace = globals()
    for public in __all__:
        if public not in namespace:
            namespace[public] = getattr(_api, public)
    return namespace[name]


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
