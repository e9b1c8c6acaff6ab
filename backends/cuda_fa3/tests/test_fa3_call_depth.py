"""From ``m2.attention`` to the FA3 launch: at most five Python frames inside magi2 on a cache hit.

The FA3 kernel object runs against a fake FA3 build (CPU), rehosted on ``cpu`` in process; the launch
is the fake's ``flash_attn_varlen_func``. ``sys.setprofile`` sees every Python frame.
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from collections.abc import Iterator

import pytest
import torch
from fa3_fakes import FakeVarlen, install
from magi2_backend_cuda_fa3 import abi as abi_mod
from magi2_backend_cuda_fa3.abi import load_fa3
from magi2_backend_cuda_fa3.discovery import FoundBuild
from magi2_backend_cuda_fa3.plugin import descriptor
from magi2_backend_cuda_fa3.provider import FA3Attention

import magi2_core as m2
from magi2_core.contracts import _checks
from magi2_core.ops import dispatcher
from magi2_core.sink_correction.choice import torch_correction
from magi2_core.testing import magi2_frames_at, registered_backend

MAX_DEPTH = 5
_MODULE = "magi2_test_fa3_depth"


@pytest.fixture
def fake_fa3(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVarlen]:
    fake = FakeVarlen()
    build = FoundBuild("fa3-fwd", ("fake_fa3_depth_interface",), "fa3_fwd", "fa3-fwd", "9.9.9", {})
    install(monkeypatch, build.modules[0], fake)
    monkeypatch.setattr(abi_mod, "torch_op_exists", lambda ns, name: ns == "fa3_fwd" and name == "fwd")
    module = types.ModuleType(_MODULE)
    module.kernel = FA3Attention(
        loader=lambda: load_fa3((build,)),  # type: ignore[attr-defined]
        correction=lambda: torch_correction("test"),
        capability=lambda index: (9, 0),
    )
    monkeypatch.setitem(sys.modules, _MODULE, module)
    cap = descriptor(build).model_copy(
        update={"name": "fa3_depth", "impl": f"{_MODULE}:kernel", "device_types": ("cpu",), "rules": ()}
    )
    with registered_backend(cap, name="fa3-depth"):
        yield fake


def test_fa3_launch_is_at_most_five_magi2_frames_deep_and_inputs_are_checked_once(
    fake_fa3: FakeVarlen, monkeypatch: pytest.MonkeyPatch
) -> None:
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(20, 4, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    cu = torch.tensor([0, 7, 20], dtype=torch.int32)
    sinks = torch.randn(1, 4, generator=g)
    checked: Counter[str] = Counter()
    original = _checks.tensor

    def counting(op: str, arg: str, value: object) -> torch.Tensor:
        checked[arg] += 1
        return original(op, arg, value)

    monkeypatch.setattr(_checks, "tensor", counting)
    dispatcher().clear()

    def call() -> object:
        return m2.attention(q, k, v, cu, cu, sinks=sinks, return_lse=True, provider="fa3_depth")

    first = call()
    assert checked == Counter({"q": 1, "k": 1, "v": 1, "cu_seqlens_q": 1, "cu_seqlens_k": 1, "sinks": 1})
    checked.clear()
    (stack,), entered = magi2_frames_at(call, fake_fa3.func.__code__)
    assert stack[-1] == "magi2_core.ops.attention.attention" and len(stack) <= MAX_DEPTH, stack
    assert not checked, checked  # the hit re-checks no argument
    assert not [f for f in entered if f.endswith(".validate")], entered
    again = call()
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert len(fake_fa3.calls) == 3
