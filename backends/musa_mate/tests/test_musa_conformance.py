"""The conformance kit against the ``mate`` descriptor, run on CPU through a fake MATE.

The fake computes sink-free attention exactly, so what the kit checks here is this backend's part:
that the descriptor claims only what the adapter serves (every dtype, feature and head dim it
generates), the keyword ABI, the LSE handling and the FP32 sink correction.
"""

from __future__ import annotations

import pytest
from musa_fakes import CORE_GENERATIONS, MusaWorld

from magi2_core.testing import registered_backend, rehost
from magi2_core.testing.runner import run_kit


@pytest.mark.parametrize("generation", CORE_GENERATIONS)
def test_kit_passes_with_a_fake_mate(world: MusaWorld, generation: str) -> None:
    world.musa_with(generation)
    with registered_backend(rehost("attention", "mate", device_types=("cpu",), name="mate_fake"), name="mate-fake"):
        report = run_kit(["mate_fake"], devices=["cpu"], max_tokens=64)
    assert report.results, report.summary()
    assert report.ok, "\n\n".join(r.report for r in report.failed)
    assert any(r.status == "passed" for r in report.results)
