"""Hardware gating for every test directory: ``gpu`` needs CUDA, ``musa`` needs a MUSA device."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from magi2_core import config
from magi2_core.model.devices import cuda_available, musa_available


def _magi2_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("MAGI2_")}


@pytest.fixture(autouse=True)
def _fresh_config() -> Iterator[None]:
    """A test that changed a MAGI2_* variable (and reloaded) leaves the configuration as it found it."""
    env, gen = _magi2_env(), config.generation
    yield
    if config.generation != gen or _magi2_env() != env:
        config.reload_config()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_cuda = pytest.mark.skip(reason="needs an NVIDIA GPU (torch.cuda.is_available() is False here)")
    no_musa = pytest.mark.skip(reason="needs a Moore Threads GPU with torch_musa and MATE (none here)")
    cuda, musa = cuda_available(), musa_available()
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(no_cuda)
        if "musa" in item.keywords and not musa:
            item.add_marker(no_musa)
