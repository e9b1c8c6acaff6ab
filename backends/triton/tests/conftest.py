"""Fixtures shared by the Triton backend's tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


@pytest.fixture
def pack_count(monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """How many gate/up banks the backend builds while the test runs: ``pack_w13`` wrapped where the
    backend calls it (a test's own ``pack_w13`` calls are not counted)."""
    from magi2_backend_triton import providers
    from magi2_backend_triton.moe import fused, pack

    built = [0]
    real = pack.pack_w13

    def counting(w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
        built[0] += 1
        return real(w_gate, w_up)

    for module in (fused, providers):
        monkeypatch.setattr(module, "pack_w13", counting)
    return lambda: built[0]
