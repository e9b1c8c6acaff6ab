"""The conformance kit against the ``fa4`` descriptor, run on CPU through the fake ``flash_attn.cute``.

The fake computes what FA4 computes (FP32 attention, the sink folded into the denominator, FA4's
early return without keys), so the kit checks this backend's part: that the descriptor claims only
what the adapter serves (sinks in both rescale modes, softcap, GQA, LSE, the whole-call ``t0`` and
empty-segment layouts), the keyword ABI and the LSE handling. The provider object is the real
``FA4Attention`` with its build, compute capability and correction injected.
"""

from __future__ import annotations

import sys
import types

import pytest
from fa4_fakes import FakeFA4, install
from magi2_backend_cuda_fa4.abi import load_fa4
from magi2_backend_cuda_fa4.discovery import FA4Install
from magi2_backend_cuda_fa4.plugin import descriptor
from magi2_backend_cuda_fa4.provider import FA4Attention

from magi2_core.sink_correction.choice import torch_correction
from magi2_core.testing import registered_backend
from magi2_core.testing.runner import run_kit

HOST = "fake_fa4_conformance_host"


def test_kit_passes_with_a_fake_fa4(monkeypatch: pytest.MonkeyPatch) -> None:
    install_ = FA4Install("4.0.0b36", "4.8.1")
    module = install(monkeypatch, FakeFA4())
    provider = FA4Attention(
        loader=lambda: load_fa4(module, install_),
        correction=lambda: torch_correction("test"),
        capability=lambda *_: (9, 0),
    )
    host = types.ModuleType(HOST)
    host.fa4 = provider  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, HOST, host)
    cap = descriptor(install_).model_copy(
        update={
            "device_types": ("cpu",),
            "name": "fa4_fake",
            "backend": "",
            "impl": f"{HOST}:fa4",
            "rules": (),
            "head_dims": (16, 128),
        }
    )
    with registered_backend(cap, name="fa4-fake"):
        report = run_kit(["fa4_fake"], devices=["cpu"], max_tokens=64)
    assert report.results, report.summary()
    assert report.ok, "\n\n".join(r.report for r in report.failed)
    passed = [r.case.id for r in report.results if r.status == "passed"]
    for label in ("t0", "empty-segments", "sinks2", "sinks1-activation-rescale", "softcap", "gqa", "lse"):
        assert any(label in case_id for case_id in passed), (label, passed)
