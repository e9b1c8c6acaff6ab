"""What a backend may import from the core: the one module the shipped backends use (docs/api.md).

A backend's plugin module imports this first, to describe itself, so it must stay cheap: each name is
imported from its home on first use (PEP 562), and ``from magi2_core.backend import BackendSpec,
Capability`` imports neither torch nor the registry. The block under ``TYPE_CHECKING`` gives
type checkers the same names (a test checks that it agrees with :data:`_HOME`).

The names, by what they are for:

* describing a backend: :class:`BackendSpec` (what its entry-point function returns), :class:`Capability`
  (:class:`Condition`, :class:`IntRange`, :class:`Rule`, :class:`Provenance`), :class:`SinkCorrectionSpec`,
  :class:`Setting` (a ``MAGI2_*`` variable it declares);
* what a kernel receives and answers: the call records (:class:`AttentionCall`, :class:`RouteCall`,
  :class:`ExpertsCall`, :class:`RMSNormCall`) and each op's kernel Protocol, :class:`Problem` and
  :class:`Feature`, :class:`Reason` and :class:`ReasonCode` (why a kernel's ``check`` rejects),
  :class:`Checkable`, :class:`Planned` and :class:`Plan`, :data:`SinkRescale`; for explain on a
  described device (:class:`VirtualDevice`): :class:`CheckableOn` (:class:`CheckedOn`) and :class:`PlannedOn`;
* the contracts a kernel implements: ``validate_<op>`` (the op's own checks, building its call record,
  for a backend's validating entry point), :func:`router_scores`, :func:`swiglu7` and its constants;
* errors: :class:`ConfigError` and the input errors;
* the platform: :func:`absent_device`, :func:`musa_installed`; configuration: ``config.get(name)`` (and
  ``config.on_reload`` for a cache that follows it); the device profile active for a device
  (:func:`profile_of` a :class:`DeviceKey`), and the plan rows a provider reads there
  (:func:`plan_rows` -> :class:`PlanRows` of :class:`PlanRow`, its backend's shipped fragments
  included), and :func:`with_routes_per_expert` (the derived field MoE plan rows are cut on);
* the sink correction: :func:`sink_correction_for`, :class:`SinkCorrection`, :func:`sink_correction`
  (the reference math);
* the public ops, for a backend's warm-up: :func:`attention`, :func:`resolve`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from magi2_core import config
    from magi2_core.contracts.moe import SWIGLU_ALPHA, SWIGLU_LIMIT, ScoreFunc, router_scores, swiglu7
    from magi2_core.errors import (
        ConfigError,
        InvalidDeviceError,
        InvalidDTypeError,
        InvalidShapeError,
        InvalidValueError,
    )
    from magi2_core.model.backend_spec import BackendSpec, Setting, SinkCorrectionSpec
    from magi2_core.model.capability import Capability, Condition, IntRange, Provenance, Rule
    from magi2_core.model.devices import absent_device, musa_installed
    from magi2_core.model.kernel import Checkable, CheckableOn, CheckedOn, Planned, PlannedOn, SinkRescale
    from magi2_core.model.plan import Plan
    from magi2_core.model.problem import Feature, Problem, with_routes_per_expert
    from magi2_core.model.virtual_device import VirtualDevice
    from magi2_core.ops import attention, resolve
    from magi2_core.ops.attention import AttentionCall, AttentionKernel
    from magi2_core.ops.attention import validate as validate_attention
    from magi2_core.ops.mhc_mix import MHCMixCall, MHCMixKernel
    from magi2_core.ops.mhc_mix import validate as validate_mhc_mix
    from magi2_core.ops.mhc_pre import MHCPreCall, MHCPreKernel
    from magi2_core.ops.mhc_pre import validate as validate_mhc_pre
    from magi2_core.ops.moe_experts import ExpertsCall, MoEExpertsKernel
    from magi2_core.ops.moe_experts import validate as validate_moe_experts
    from magi2_core.ops.moe_route import MoERouteKernel, RouteCall
    from magi2_core.ops.moe_route import validate as validate_moe_route
    from magi2_core.ops.output_gate import OutputGateCall, OutputGateKernel
    from magi2_core.ops.output_gate import validate as validate_output_gate
    from magi2_core.ops.qk_norm_rope import QKNormRopeCall, QKNormRopeKernel
    from magi2_core.ops.qk_norm_rope import validate as validate_qk_norm_rope
    from magi2_core.ops.rmsnorm import RMSNormCall, RMSNormKernel
    from magi2_core.ops.rmsnorm import validate as validate_rmsnorm
    from magi2_core.profiles import DeviceKey, PlanRow, PlanRows, plan_rows, profile_of
    from magi2_core.reasons import Reason, ReasonCode
    from magi2_core.sink_correction.choice import SinkCorrection, sink_correction_for
    from magi2_core.sink_correction.reference import sink_correction

# Each name's home: (module, attribute).
_HOME: dict[str, tuple[str, str]] = {
    "Capability": ("magi2_core.model.capability", "Capability"),
    "Condition": ("magi2_core.model.capability", "Condition"),
    "IntRange": ("magi2_core.model.capability", "IntRange"),
    "Provenance": ("magi2_core.model.capability", "Provenance"),
    "Rule": ("magi2_core.model.capability", "Rule"),
    "SWIGLU_ALPHA": ("magi2_core.contracts.moe", "SWIGLU_ALPHA"),
    "SWIGLU_LIMIT": ("magi2_core.contracts.moe", "SWIGLU_LIMIT"),
    "ScoreFunc": ("magi2_core.contracts.moe", "ScoreFunc"),
    "router_scores": ("magi2_core.contracts.moe", "router_scores"),
    "swiglu7": ("magi2_core.contracts.moe", "swiglu7"),
    "ConfigError": ("magi2_core.errors", "ConfigError"),
    "InvalidDTypeError": ("magi2_core.errors", "InvalidDTypeError"),
    "InvalidDeviceError": ("magi2_core.errors", "InvalidDeviceError"),
    "InvalidShapeError": ("magi2_core.errors", "InvalidShapeError"),
    "InvalidValueError": ("magi2_core.errors", "InvalidValueError"),
    "BackendSpec": ("magi2_core.model.backend_spec", "BackendSpec"),
    "SinkCorrectionSpec": ("magi2_core.model.backend_spec", "SinkCorrectionSpec"),
    "Setting": ("magi2_core.model.backend_spec", "Setting"),
    "AttentionCall": ("magi2_core.ops.attention", "AttentionCall"),
    "AttentionKernel": ("magi2_core.ops.attention", "AttentionKernel"),
    "validate_attention": ("magi2_core.ops.attention", "validate"),
    "MoERouteKernel": ("magi2_core.ops.moe_route", "MoERouteKernel"),
    "RouteCall": ("magi2_core.ops.moe_route", "RouteCall"),
    "validate_moe_route": ("magi2_core.ops.moe_route", "validate"),
    "ExpertsCall": ("magi2_core.ops.moe_experts", "ExpertsCall"),
    "MoEExpertsKernel": ("magi2_core.ops.moe_experts", "MoEExpertsKernel"),
    "validate_moe_experts": ("magi2_core.ops.moe_experts", "validate"),
    "RMSNormCall": ("magi2_core.ops.rmsnorm", "RMSNormCall"),
    "RMSNormKernel": ("magi2_core.ops.rmsnorm", "RMSNormKernel"),
    "validate_rmsnorm": ("magi2_core.ops.rmsnorm", "validate"),
    "MHCPreCall": ("magi2_core.ops.mhc_pre", "MHCPreCall"),
    "MHCPreKernel": ("magi2_core.ops.mhc_pre", "MHCPreKernel"),
    "validate_mhc_pre": ("magi2_core.ops.mhc_pre", "validate"),
    "MHCMixCall": ("magi2_core.ops.mhc_mix", "MHCMixCall"),
    "MHCMixKernel": ("magi2_core.ops.mhc_mix", "MHCMixKernel"),
    "validate_mhc_mix": ("magi2_core.ops.mhc_mix", "validate"),
    "QKNormRopeCall": ("magi2_core.ops.qk_norm_rope", "QKNormRopeCall"),
    "QKNormRopeKernel": ("magi2_core.ops.qk_norm_rope", "QKNormRopeKernel"),
    "validate_qk_norm_rope": ("magi2_core.ops.qk_norm_rope", "validate"),
    "OutputGateCall": ("magi2_core.ops.output_gate", "OutputGateCall"),
    "OutputGateKernel": ("magi2_core.ops.output_gate", "OutputGateKernel"),
    "validate_output_gate": ("magi2_core.ops.output_gate", "validate"),
    "attention": ("magi2_core.ops", "attention"),
    "resolve": ("magi2_core.ops", "resolve"),
    "Plan": ("magi2_core.model.plan", "Plan"),
    "absent_device": ("magi2_core.model.devices", "absent_device"),
    "musa_installed": ("magi2_core.model.devices", "musa_installed"),
    "Feature": ("magi2_core.model.problem", "Feature"),
    "Problem": ("magi2_core.model.problem", "Problem"),
    "with_routes_per_expert": ("magi2_core.model.problem", "with_routes_per_expert"),
    "DeviceKey": ("magi2_core.profiles", "DeviceKey"),
    "profile_of": ("magi2_core.profiles", "profile_of"),
    "PlanRow": ("magi2_core.profiles", "PlanRow"),
    "PlanRows": ("magi2_core.profiles", "PlanRows"),
    "plan_rows": ("magi2_core.profiles", "plan_rows"),
    "Checkable": ("magi2_core.model.kernel", "Checkable"),
    "Planned": ("magi2_core.model.kernel", "Planned"),
    "CheckableOn": ("magi2_core.model.kernel", "CheckableOn"),
    "CheckedOn": ("magi2_core.model.kernel", "CheckedOn"),
    "PlannedOn": ("magi2_core.model.kernel", "PlannedOn"),
    "VirtualDevice": ("magi2_core.model.virtual_device", "VirtualDevice"),
    "SinkRescale": ("magi2_core.model.kernel", "SinkRescale"),
    "Reason": ("magi2_core.reasons", "Reason"),
    "ReasonCode": ("magi2_core.reasons", "ReasonCode"),
    "SinkCorrection": ("magi2_core.sink_correction.choice", "SinkCorrection"),
    "sink_correction_for": ("magi2_core.sink_correction.choice", "sink_correction_for"),
    "sink_correction": ("magi2_core.sink_correction.reference", "sink_correction"),
    "config": ("magi2_core", "config"),
}

__all__ = [
    "AttentionCall",
    "AttentionKernel",
    "BackendSpec",
    "Capability",
    "Checkable",
    "CheckableOn",
    "CheckedOn",
    "Condition",
    "ConfigError",
    "DeviceKey",
    "ExpertsCall",
    "Feature",
    "IntRange",
    "InvalidDTypeError",
    "InvalidDeviceError",
    "InvalidShapeError",
    "InvalidValueError",
    "MHCMixCall",
    "MHCMixKernel",
    "MHCPreCall",
    "MHCPreKernel",
    "MoEExpertsKernel",
    "MoERouteKernel",
    "OutputGateCall",
    "OutputGateKernel",
    "Plan",
    "PlanRow",
    "PlanRows",
    "Planned",
    "PlannedOn",
    "Problem",
    "Provenance",
    "QKNormRopeCall",
    "QKNormRopeKernel",
    "RMSNormCall",
    "RMSNormKernel",
    "Reason",
    "ReasonCode",
    "RouteCall",
    "Rule",
    "SWIGLU_ALPHA",
    "SWIGLU_LIMIT",
    "ScoreFunc",
    "Setting",
    "SinkCorrection",
    "SinkCorrectionSpec",
    "SinkRescale",
    "VirtualDevice",
    "absent_device",
    "attention",
    "config",
    "musa_installed",
    "plan_rows",
    "profile_of",
    "resolve",
    "router_scores",
    "sink_correction",
    "sink_correction_for",
    "swiglu7",
    "validate_attention",
    "validate_mhc_mix",
    "validate_mhc_pre",
    "validate_moe_experts",
    "validate_moe_route",
    "validate_output_gate",
    "validate_qk_norm_rope",
    "validate_rmsnorm",
    "with_routes_per_expert",
]


def __getattr__(name: str) -> Any:
    """Import ``name`` from its home on first use (PEP 562) and keep it here."""
    try:
        module, attr = _HOME[name]
    except KeyError:
        raise AttributeError(
            f"magi2_core.backend has no name {name!r}; a backend may use only the names "
            f"in its __all__ (docs/api.md, 'For backend authors')"
        ) from None
    home = importlib.import_module(module)
    value = getattr(home, attr) if hasattr(home, attr) else importlib.import_module(f"{module}.{attr}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
