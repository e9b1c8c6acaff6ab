"""Whether this host has a device of the type a torch-native provider is asked to serve.

``magi2 explain --device cuda`` on a host without CUDA resolves a described problem: every provider
of this backend that needs the device says so in the same words (and as the Triton backend does),
instead of one op rejecting its provider and another choosing it.
"""

from __future__ import annotations

from magi2_core.platform import cuda_available, musa_available
from magi2_core.resolution import Reason, ReasonCode

__all__ = ["absent_device"]


def absent_device(device_type: str) -> list[Reason]:
    """One ``unavailable`` reason when ``device_type`` is CUDA or MUSA and this host has none."""
    if device_type == "cuda" and not cuda_available():
        return [Reason(code=ReasonCode.UNAVAILABLE, field="cuda", expected="a CUDA device", actual="none visible")]
    if device_type == "musa" and not musa_available():
        return [Reason(code=ReasonCode.UNAVAILABLE, field="musa", expected="torch_musa with a MUSA device",
                       actual="none visible")]
    return []
