"""Shared fixtures: per-test seeding and random-input factories (fresh inputs, never zeros)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence

import pytest
import torch
from oracles import MakeTensor

SEEDS = (3, 17, 2024)


@pytest.fixture(autouse=True)
def _seed_from_test_id(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test gets its own reproducible stream (its node id), independent of test order."""
    state = torch.random.get_rng_state()
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield
    torch.random.set_rng_state(state)


@pytest.fixture(params=SEEDS, ids=lambda s: f"seed{s}")
def seed(request: pytest.FixtureRequest) -> int:
    """Parametrises a test over several seeds and reseeds torch with the current one."""
    torch.manual_seed(request.param)
    return int(request.param)


def _make(
    shape: Sequence[int], dtype: torch.dtype = torch.float32, *, scale: float = 1.0, contiguous: bool = True
) -> torch.Tensor:
    """``randn(shape) * scale`` rounded to ``dtype``; ``contiguous=False`` returns a strided view
    (every other element of the last dim of a twice-as-wide tensor)."""
    shape = tuple(shape)
    if contiguous:
        return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype)
    wide = (torch.randn((*shape[:-1], 2 * shape[-1]), dtype=torch.float64) * scale).to(dtype)
    view = wide[..., ::2]
    assert shape[-1] <= 1 or view.numel() == 0 or not view.is_contiguous()
    return view


@pytest.fixture
def make() -> MakeTensor:
    return _make
