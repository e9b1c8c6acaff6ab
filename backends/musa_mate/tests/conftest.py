"""Fixtures of the MUSA/MATE tests (the fakes themselves live in musa_fakes.py).

On a MUSA machine the runtime is brought up here, at collection, torchada first: ``torch.musa``
exists only once torch_musa is imported, and the repository's hardware gate (``musa`` marker, root
conftest.py) asks ``torch.musa.is_available()``. Off MUSA nothing is imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from magi2_backend_musa_mate.platform import import_musa_runtime, musa_installed
from musa_fakes import MusaWorld, fake_world

if musa_installed():
    # A missing torchada/torch_musa is reported by the hardware tests' own skip reason.
    with contextlib.suppress(ImportError):
        import_musa_runtime()


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[MusaWorld]:
    with fake_world(monkeypatch) as w:
        yield w
