"""Which learned-sink correction runs on a device: contributed by backends, chosen once per device type.

Attention providers whose kernel runs without sinks (FA3, FA4's ``"activation"`` rescale, MATE,
torch's varlen) get the kernel's LSE and fold the sinks in afterwards
(:mod:`magi2_core.sink_correction.reference`). They
ask :func:`sink_correction_for` for the correction of their device type and call its ``apply``.

Backends contribute corrections in their spec (``BackendSpec.sink_corrections``) as
:class:`~magi2_core.model.backend_spec.SinkCorrectionSpec` descriptors; the core's torch correction
(:func:`magi2_core.sink_correction.reference.apply_sink_correction`, named ``"torch"``) serves every device type. For a
device type the choice is, in order:

1. the name that a backend's setting forces for it (a :class:`~magi2_core.model.backend_spec.Setting` with
   ``forces_sink_correction_on``, collected in ``RegistryState.forced_by``: magi2-backend-musa-mate's
   ``MAGI2_MATE_SINK_CORRECTION`` on MUSA, where the fused Triton kernel is opt-in until it has run on
   the hardware); a name that no backend contributes, or whose kernel does not import, is a
   :class:`~magi2_core.errors.ConfigError`;
2. the highest-priority contributed correction that lists the device type and whose kernel imports;
3. the torch correction.

The choice is made once per device type and kept until the registry or the configuration changes.

Why this is not a provider of an op like the others: a correction is not an operator that users
call, with a problem to resolve and a contract to check, but a helper that attention providers call
after their kernel; what picks it is the device type alone (no dtype, shape or feature), so the op
resolver, its rules, profiles and ``explain`` would have nothing to decide. It stays this small table.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from magi2_core import config
from magi2_core.errors import ConfigError
from magi2_core.selection.registry import TORCH_SINK_CORRECTION, get_registry

if TYPE_CHECKING:
    import torch

    from magi2_core.model.backend_spec import SinkCorrectionSpec
    from magi2_core.model.kernel import SinkRescale

__all__ = ["TORCH", "SinkCorrection", "SinkCorrectionFn", "sink_correction_for", "torch_correction"]

TORCH = TORCH_SINK_CORRECTION  # the core's own correction: always there, never contributed by a backend
TORCH_IMPL = "magi2_core.sink_correction.reference:apply_sink_correction"


class SinkCorrectionFn(Protocol):
    """Fold learned sinks into an attention output computed without them (operators.md §2.3 of the spec).

    Launch-only: the attention contract validated the inputs, so nothing is checked again.
    ``o [T, H, D]`` is the caller's fresh kernel output and may be overwritten (the result may alias
    it); ``lse [H, T]`` FP32 natural-log LSE of the sink-free attention; ``sinks [S, H]`` FP32 with
    ``S >= 1``, on o's device; ``rescale`` ``"fp32"`` or ``"activation"``. Returns the corrected
    output (o's dtype) and, when ``return_lse``, the corrected ``[H, T]`` FP32 LSE, else ``None``.
    """

    def __call__(
        self, o: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor, *, rescale: SinkRescale, return_lse: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclass(frozen=True)
class SinkCorrection:
    """The correction chosen for a device type: its name, why it was chosen, and the callable."""

    name: str
    detail: str
    apply: SinkCorrectionFn


def _load(impl: str) -> SinkCorrectionFn:
    module, _, attr = impl.partition(":")
    obj: object = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{impl} is a {type(obj).__name__}, not a callable")
    return obj


def torch_correction(detail: str) -> SinkCorrection:
    """The core's torch correction (several launches, exact reference arithmetic, any device)."""
    return SinkCorrection(TORCH, detail, _load(TORCH_IMPL))


def _contributed(spec: SinkCorrectionSpec, why: str) -> SinkCorrection:
    try:
        fn = _load(spec.impl)
    except Exception as exc:  # Triton absent, a broken build: say so, the caller decides what follows
        raise ImportError(
            f"{spec.name} ({spec.impl}, from {spec.backend}) does not import: {type(exc).__name__}: {exc}"
        ) from exc
    return SinkCorrection(spec.name, f"{spec.impl} from {spec.backend} ({why})", fn)


def _choose(device_type: str, specs: tuple[SinkCorrectionSpec, ...], forced_by: Mapping[str, str]) -> SinkCorrection:
    var = forced_by.get(device_type)
    forced = str(config.get(var)) if var is not None else None
    if var is not None and forced is not None and forced != TORCH:
        spec = next((s for s in specs if s.name == forced), None)
        accepted = " | ".join([TORCH, *(s.name for s in specs)])
        if spec is None:
            raise ConfigError(
                var, forced, accepted, f"no installed backend contributes a sink correction named {forced!r}"
            )
        try:
            return _contributed(spec, f"forced by {var}")
        except ImportError as exc:
            raise ConfigError(var, forced, accepted, str(exc)) from None
    if forced == TORCH:
        return torch_correction(f"{TORCH_IMPL} (forced by {var})")
    skipped: list[str] = []
    for spec in specs:  # priority descending
        if device_type in spec.device_types:
            try:
                return _contributed(spec, f"priority {spec.priority} on {device_type}")
            except ImportError as exc:
                skipped.append(str(exc))
    why = "; ".join(skipped) or f"no contributed correction declares {device_type}"
    return torch_correction(f"{TORCH_IMPL} ({why})")


_lock = threading.Lock()
_chosen: dict[str, SinkCorrection] = {}
_chosen_for: tuple[int, int] = (-1, -1)  # (registry generation, config generation) of _chosen


def sink_correction_for(device_type: str) -> SinkCorrection:
    """The correction for ``device_type`` (chosen on first use, then cached; see the module doc)."""
    global _chosen_for
    state = get_registry().state()
    key = (state.generation, config.generation)
    if key == _chosen_for:
        hit = _chosen.get(device_type)
        if hit is not None:
            return hit
    with _lock:
        if key != _chosen_for:
            _chosen.clear()
            _chosen_for = key
        chosen = _chosen.get(device_type)
        if chosen is None:
            chosen = _chosen[device_type] = _choose(device_type, state.sink_corrections, state.forced_by)
        return chosen
