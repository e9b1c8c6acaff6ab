"""Declares a setting whose variable the core already declares (``MAGI2_SHADOW``): quarantined, and
the core's variable keeps its meaning."""

from magi2_core import BackendSpec
from magi2_core.backend import Setting


def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-broken-setting",
        version="0.0.1",
        core_api=">=2.0,<3",
        providers=(),
        settings=(Setting(name="MAGI2_SHADOW", kind="boolean", default=True, help="shadow everything, or not"),),
    )
