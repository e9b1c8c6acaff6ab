"""Shared fixtures: the backends registered even where they are on the path but not pip-installed."""

from __future__ import annotations

import pytest

from magi2_core.selection.registry import get_registry


@pytest.fixture
def registered() -> None:
    """Make sure the reference, FA3 and FA4 providers are in the process registry."""
    import magi2_backend_cuda_fa3.plugin as fa3_plugin
    import magi2_backend_cuda_fa4.plugin as fa4_plugin
    import magi2_backend_reference.plugin as ref_plugin

    reg = get_registry()
    if reg.provider("attention", "reference") is None:
        reg.register(ref_plugin, name="reference")
    if reg.provider("attention", "fa3") is None:
        reg.register(fa3_plugin, name="cuda_fa3")
    if reg.provider("attention", "fa4") is None:
        reg.register(fa4_plugin, name="cuda_fa4")
