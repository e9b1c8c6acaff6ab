"""magi2-core: contracts, registry and resolver for the MAGI-2 operators.

>>> import magi2_core as m2
>>> m2.resolve  # doctest: +ELLIPSIS
<function resolve at ...>
"""

from magi2_core._version import CORE_API_VERSION, __version__
from magi2_core.capability import Capability, Condition, IntRange, Provenance, Rule
from magi2_core.config import reload_config
from magi2_core.contracts._checks import set_device_value_checks
from magi2_core.errors import (
    ConfigError,
    InvalidDeviceError,
    InvalidDTypeError,
    InvalidInputError,
    InvalidShapeError,
    InvalidValueError,
    Magi2Error,
    NoEligibleProviderError,
    ProviderNotEligibleError,
    ResolutionError,
    UnknownProviderError,
)
from magi2_core.hookspecs import BackendSpec, hookimpl
from magi2_core.moe_weights import PreparedMoEWeights
from magi2_core.ops import attention, moe_experts, moe_route, prepare_moe_weights, resolve, rmsnorm
from magi2_core.overrides import use
from magi2_core.problem import Feature, Problem
from magi2_core.registry import get_registry
from magi2_core.resolution import Candidate, Reason, ReasonCode, Resolution, Verdict

__all__ = [
    "CORE_API_VERSION",
    "BackendSpec",
    "Candidate",
    "Capability",
    "Condition",
    "ConfigError",
    "Feature",
    "IntRange",
    "InvalidDTypeError",
    "InvalidDeviceError",
    "InvalidInputError",
    "InvalidShapeError",
    "InvalidValueError",
    "Magi2Error",
    "NoEligibleProviderError",
    "PreparedMoEWeights",
    "Problem",
    "Provenance",
    "ProviderNotEligibleError",
    "Reason",
    "ReasonCode",
    "Resolution",
    "ResolutionError",
    "Rule",
    "UnknownProviderError",
    "Verdict",
    "__version__",
    "attention",
    "get_registry",
    "hookimpl",
    "moe_experts",
    "moe_route",
    "prepare_moe_weights",
    "resolve",
    "rmsnorm",
    "use",
    "set_device_value_checks",
    "reload_config",
]
