"""The ``MAGI2_*`` variables of magi2-backend-musa-mate, declared in its spec (``BackendSpec.settings``).

The registry declares them in :mod:`magi2_core.config` under this backend's name while the backend is
loaded; the provider reads them with ``magi2_core.config.get(<setting>.name)``.
"""

from __future__ import annotations

from magi2_backend_musa_mate.platform import DEVICE_TYPE
from magi2_core.backend import Setting

__all__ = ["MATE_BACKEND", "MATE_SINK_CORRECTION", "SETTINGS"]

MATE_BACKEND = Setting(
    name="MAGI2_MATE_BACKEND",
    kind="choice",
    choices=("auto", "mutlass", "mubin"),
    default=None,
    help="MUSA only: the MATE kernel family the `mate` attention provider asks for (unset: MATE's own default).",
)
MATE_SINK_CORRECTION = Setting(
    name="MAGI2_MATE_SINK_CORRECTION",
    kind="choice",
    choices=("torch", "triton"),
    default="torch",
    help="MUSA only: the learned-sink correction after attention without sinks (MATE): the core's torch "
    "correction or the fused Triton kernel that magi2-backend-triton contributes (validated on CUDA only, "
    "hence opt-in on MUSA). `magi2 backends` shows the correction each device type gets.",
    forces_sink_correction_on=DEVICE_TYPE,
)
SETTINGS = (MATE_BACKEND, MATE_SINK_CORRECTION)
