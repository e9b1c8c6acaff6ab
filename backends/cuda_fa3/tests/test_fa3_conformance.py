"""The conformance kit against the ``fa3`` descriptor, run on CPU through a fake fa3-fwd build.

The fake computes sink-free attention exactly (the reference, rounded once), so the kit checks this
backend's part: that the descriptor claims only what the adapter serves, the keyword ABI, the LSE
checks and the sink correction. The provider object is the real ``FA3Attention`` with its build,
compute capability and correction injected.
"""

from __future__ import annotations

import sys
import types

import pytest
from fa3_fakes import FakeVarlen, install
from magi2_backend_cuda_fa3 import abi as abi_mod
from magi2_backend_cuda_fa3.abi import load_fa3
from magi2_backend_cuda_fa3.discovery import FoundBuild
from magi2_backend_cuda_fa3.plugin import descriptor
from magi2_backend_cuda_fa3.provider import FA3Attention

from magi2_core.sink_correction.choice import torch_correction
from magi2_core.testing import registered_backend
from magi2_core.testing.runner import run_kit

HOST = "fake_fa3_conformance_host"


@pytest.mark.parametrize("fp16", [True, False], ids=["fp16-build", "no-fp16-build"])
def test_kit_passes_with_a_fake_fa3_fwd(monkeypatch: pytest.MonkeyPatch, fp16: bool) -> None:
    build = FoundBuild(
        "fa3-fwd",
        ("fake_fa3_fwd_interface",),
        "fa3_fwd",
        "fa3-fwd",
        "9.9.9",  # type: ignore[arg-type]
        {"FLASHATTENTION_DISABLE_FP16": not fp16},
    )
    install(monkeypatch, build.modules[0], FakeVarlen())
    monkeypatch.setattr(abi_mod, "torch_op_exists", lambda ns, name: ns == "fa3_fwd" and name == "fwd")
    provider = FA3Attention(
        loader=lambda: load_fa3((build,)), correction=lambda: torch_correction("test"), capability=lambda index: (9, 0)
    )
    host = types.ModuleType(HOST)
    host.fa3 = provider  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, HOST, host)
    cap = descriptor(build).model_copy(
        update={"device_types": ("cpu",), "name": "fa3_fake", "backend": "", "impl": f"{HOST}:fa3", "rules": ()}
    )
    assert ("float16" in cap.dtypes) is fp16  # the descriptor follows the build
    with registered_backend(cap, name="fa3-fake"):
        report = run_kit(["fa3_fake"], devices=["cpu"], max_tokens=64)
    assert report.results, report.summary()
    assert report.ok, "\n\n".join(r.report for r in report.failed)
    assert any(r.status == "passed" for r in report.results)
