"""The public API of ``magi2_core``, imported on first use of any public name (see ``__init__``).

New public names are imported here and listed in ``__all__`` of ``magi2_core/__init__.py``.
"""

# ruff: noqa: F401
from magi2_core.config import reload_config
from magi2_core.contracts.moe_weights import PreparedMoEWeights
from magi2_core.errors import (
    ConfigChangeError,
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
    StrictModeError,
    UnknownProviderError,
)
from magi2_core.model.backend_spec import BackendSpec, Setting, SinkCorrectionSpec, hookimpl
from magi2_core.model.capability import Capability, Condition, IntRange, Rule
from magi2_core.model.problem import Feature, Problem
from magi2_core.ops import (
    attention,
    mhc_mix,
    mhc_pre,
    moe_experts,
    moe_route,
    output_gate,
    prepare_moe_weights,
    qk_norm_rope,
    resolve,
    rmsnorm,
)
from magi2_core.reasons import Resolution
from magi2_core.selection import shadow
from magi2_core.selection.dispatch import set_device_value_checks, set_strict
from magi2_core.selection.overrides import use
from magi2_core.selection.registry import get_registry
