"""Call depth and validation count on the hot path, counted with ``sys.setprofile``.

From the public op down to the provider's kernel, a repeated call (a cache hit) passes through at most
five Python frames inside magi2 packages, and no input is validated twice in one call: the first call
validates each argument once, a repeated call layout reuses that validation.
"""

from __future__ import annotations

import sys
import types
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import magi2_core as m2
from magi2_core.contracts import _checks
from magi2_core.model.capability import Capability
from magi2_core.model.problem import OPS, Feature
from magi2_core.ops import dispatcher
from magi2_core.ops.attention import AttentionCall
from magi2_core.ops.mhc_pre import MHCPreCall
from magi2_core.ops.moe_route import RouteCall
from magi2_core.testing import magi2_frames_at, registered_backend

MAX_DEPTH = 5
_MODULE = "magi2_test_recording_kernels"


def _recording_kernel(call: Any) -> Any:
    x = call[0]
    if isinstance(call, AttentionCall):
        return x, x.new_zeros(x.shape[1], x.shape[0]) if call.return_lse else None
    if isinstance(call, RouteCall):
        return x, x
    if isinstance(call, MHCPreCall):
        return x[:, 0], x[:, :, 0], x
    return x


@pytest.fixture(scope="module")
def recording() -> Iterator[str]:
    module = types.ModuleType(_MODULE)
    module.kernel = _recording_kernel  # type: ignore[attr-defined]
    sys.modules[_MODULE] = module
    caps = [
        Capability(
            op=op,
            name="recording",
            impl=f"{_MODULE}:kernel",
            device_types=("cpu",),
            dtypes=("float32",),
            features=frozenset(Feature),
            priority=-1000,
        )
        for op in OPS
    ]
    with registered_backend(*caps, name="recording"):
        yield "recording"
    del sys.modules[_MODULE]


def _calls() -> dict[str, Callable[[str], object]]:
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(12, 2, 16, generator=g) for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    sinks = torch.randn(1, 2, generator=g)
    x = torch.randn(6, 2, 8, generator=g)
    router, bias = torch.randn(8, 8, generator=g), torch.randn(8, generator=g)
    probs, idx = torch.rand(2, 6, 2, generator=g), torch.randint(0, 4, (2, 6, 2), generator=g)
    wg, wu = torch.randn(8, 8, 16, generator=g), torch.randn(8, 8, 16, generator=g)
    wd = torch.randn(8, 16, 8, generator=g)
    xn, wn = torch.randn(6, 32, generator=g), torch.randn(2, 1, 32, generator=g)
    streams, branch = torch.randn(6, 2, 8, generator=g), torch.randn(6, 8, generator=g)  # n = 2 streams, D = 8
    mw, phi = torch.randn(2 * 16, generator=g), torch.randn(16, 8, generator=g)  # 2 modalities; 2n + n² = 8
    a, bn, bnn = torch.rand(1, generator=g), torch.randn(2, generator=g), torch.randn(2, 2, generator=g)
    post, res = torch.rand(6, 2, generator=g), torch.rand(6, 2, 2, generator=g)
    return {
        "attention": lambda p: m2.attention(q, k, v, cu, cu, sinks=sinks, softcap=3.0, return_lse=True, provider=p),
        "moe_route": lambda p: m2.moe_route(x, router, bias, top_k=2, provider=p),
        "moe_experts": lambda p: m2.moe_experts(x, probs, idx, wg, wu, wd, provider=p),
        "rmsnorm": lambda p: m2.rmsnorm(xn, wn, modality_sizes=[2, 4], provider=p),
        "mhc_pre": lambda p: m2.mhc_pre(streams, mw, phi, a, a, a, bn, bn, bnn, modality_sizes=[2, 4], provider=p),
        "mhc_mix": lambda p: m2.mhc_mix(streams, branch, post, res, provider=p),
        "qk_norm_rope": lambda p: m2.qk_norm_rope(
            q, wn[:, 0, :16], k[:, 0, :8], modality_sizes=[7, 5], index=cu[:1].long().expand(12), provider=p
        ),
        "output_gate": lambda p: m2.output_gate(q, k[:, :, 0], index=cu[:1].long().expand(12), provider=p),
    }


@pytest.mark.parametrize("op", OPS)
def test_cache_hit_is_at_most_five_magi2_frames_deep(recording: str, op: str) -> None:
    call = _calls()[op]
    call(recording)  # the first call of this layout validates and resolves
    stacks, entered = magi2_frames_at(lambda: call(recording), _recording_kernel.__code__)
    (stack,) = stacks
    assert stack[-1] == f"magi2_core.ops.{op}.{op}", stack  # entered through the public op
    assert len(stack) <= MAX_DEPTH, stack
    # a hit validates nothing again: no contract check runs but value checks of host tensors
    assert not [f for f in entered if f.endswith(".validate")], entered


@pytest.mark.parametrize("op", OPS)
def test_first_call_validates_each_input_once(recording: str, op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: Counter[str] = Counter()
    original = _checks.tensor

    def counting(op_name: str, arg: str, value: object) -> torch.Tensor:
        seen[arg] += 1
        return original(op_name, arg, value)

    monkeypatch.setattr(_checks, "tensor", counting)
    dispatcher().clear()  # a fresh layout cache: this call validates
    _calls()[op](recording)
    assert seen and set(seen.values()) == {1}, seen
    seen.clear()
    _calls()[op](recording)  # same layout: no argument is checked again
    assert not seen, seen
