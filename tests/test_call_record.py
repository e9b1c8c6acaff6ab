"""Core API 2: a provider receives one frozen call record, the same one that shadow verification and a
repeated call layout see, equal to what validation builds (``magi2_core.testing.call_record``)."""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import magi2_core as m2
from magi2_core.model.capability import Capability
from magi2_core.model.problem import OPS, Feature
from magi2_core.ops import SPECS
from magi2_core.ops.attention import AttentionCall
from magi2_core.ops.mhc_mix import MHCMixCall
from magi2_core.ops.mhc_pre import MHCPreCall
from magi2_core.ops.moe_experts import ExpertsCall
from magi2_core.ops.moe_route import RouteCall
from magi2_core.ops.output_gate import OutputGateCall
from magi2_core.ops.qk_norm_rope import QKNormRopeCall
from magi2_core.ops.rmsnorm import RMSNormCall
from magi2_core.selection import shadow
from magi2_core.testing import call_record, registered_backend
from magi2_core.testing.op_cases.mhc_pre import mhc_parameters

_MODULE = "magi2_test_call_record_kernels"
RECORDS = {
    "attention": AttentionCall,
    "moe_route": RouteCall,
    "moe_experts": ExpertsCall,
    "rmsnorm": RMSNormCall,
    "mhc_pre": MHCPreCall,
    "mhc_mix": MHCMixCall,
    "qk_norm_rope": QKNormRopeCall,
    "output_gate": OutputGateCall,
}
SEEN: list[Any] = []


def _kernel(call: Any) -> Any:
    SEEN.append(call)
    x = call[0]
    if isinstance(call, AttentionCall):
        return x, x.new_zeros(x.shape[1], x.shape[0]) if call.return_lse else None
    if isinstance(call, RouteCall):
        return x.new_zeros(x.shape[1], x.shape[0], call.top_k), torch.zeros(
            x.shape[1], x.shape[0], call.top_k, dtype=torch.int64
        )
    if isinstance(call, MHCPreCall):
        return x[:, 0], x[:, :, 0], x.new_zeros(x.shape[0], x.shape[1], x.shape[1])
    return x


@pytest.fixture(scope="module")
def recording() -> Iterator[str]:
    module = types.ModuleType(_MODULE)
    module.kernel = _kernel  # type: ignore[attr-defined]
    sys.modules[_MODULE] = module
    caps = [
        Capability(
            op=op,
            name="record_seen",
            impl=f"{_MODULE}:kernel",
            device_types=("cpu",),
            dtypes=("float32",),
            features=frozenset(Feature),
            priority=-1000,
        )
        for op in OPS
    ]
    with registered_backend(*caps, name="record_seen"):
        yield "record_seen"
    del sys.modules[_MODULE]


def _calls() -> dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(12, 2, 16, generator=g) for _ in range(3))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    x = torch.randn(6, 2, 8, generator=g)
    router, bias = torch.randn(8, 8, generator=g), torch.randn(8, generator=g)
    probs, idx = torch.rand(2, 6, 2, generator=g), torch.randint(0, 4, (2, 6, 2), generator=g)
    wg, wu = torch.randn(8, 8, 16, generator=g), torch.randn(8, 8, 16, generator=g)
    wd = torch.randn(8, 16, 8, generator=g)
    xn, wn = torch.randn(6, 32, generator=g), torch.randn(2 * 32, generator=g)  # a flat weight: viewed [2, 1, 32]
    return {
        "attention": (
            m2.attention,
            (q, k, v, cu, cu),
            {"sinks": torch.randn(1, 2, generator=g), "softcap": 3.0, "return_lse": True},
        ),
        "moe_route": (m2.moe_route, (x, router, bias), {"top_k": 2, "score_func": "softmax", "route_norm": False}),
        "moe_experts": (m2.moe_experts, (x, probs, idx, wg, wu, wd), {"deterministic": True}),
        "rmsnorm": (m2.rmsnorm, (xn, wn), {"modality_sizes": [2, 4], "eps": 1e-5}),
        "mhc_pre": (
            m2.mhc_pre,
            (x, *mhc_parameters(g, 2, 2, 8)),  # a flat norm weight: viewed [2, 16]
            {"modality_sizes": [2, 4], "sinkhorn_iterations": 3, "out_dtype": torch.float32},
        ),
        "mhc_mix": (m2.mhc_mix, (x, x[:, 0], probs[0], torch.rand(6, 2, 2, generator=g)), {}),
        "qk_norm_rope": (  # a flat weight: viewed [2, 8]
            m2.qk_norm_rope,
            (x, torch.randn(2 * 8, generator=g), torch.randn(6, 4, generator=g)),
            {"modality_sizes": [2, 4], "index": torch.randperm(6, generator=g), "out_dtype": torch.bfloat16},
        ),
        "output_gate": (  # a [T, H, 1] gate, as upstream views it
            m2.output_gate,
            (x, torch.randn(6, 2, 1, generator=g)),
            {"index": torch.randperm(6, generator=g), "out_dtype": torch.bfloat16},
        ),
    }


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return type(a) is type(b) and all(
        x is y or (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)) or x == y
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("op", OPS)
def test_the_kernel_receives_one_frozen_record_equal_to_validation_on_first_and_repeated_calls(
    recording: str, op: str
) -> None:
    fn, args, kwargs = _calls()[op]
    SEEN.clear()
    fn(*args, **kwargs, provider=recording)  # validates and resolves this layout
    fn(*args, **kwargs, provider=recording)  # a cache hit: the record is rebuilt from the kept fields
    first, again = SEEN
    assert type(first) is RECORDS[op] and first._fields[-1] == "key"
    expected = call_record(op, *args, **kwargs)  # type: ignore[call-overload]
    assert _same(first, expected) and _same(again, expected)
    assert again.key == SPECS[op].validate_arguments(args, kwargs).key  # type: ignore[index]
    with pytest.raises(AttributeError):
        again.key = None  # frozen: a provider cannot change what shadow verification compares against
    with pytest.raises(TypeError):
        again[0] = None  # type: ignore[index]


def test_shadow_verification_receives_the_very_record_the_kernel_got(
    recording: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    observed: list[Any] = []
    monkeypatch.setattr(shadow, "observe", lambda scope, spec, provider, call, out: observed.append(call))
    with shadow.shadow(rate=1.0):
        for op, (fn, args, kwargs) in _calls().items():
            SEEN.clear()
            fn(*args, **kwargs, provider=recording)
            assert observed.pop() is SEEN[-1], op


def test_call_record_refuses_what_the_op_refuses_and_names_unknown_ops() -> None:
    q = torch.randn(4, 2, 8)
    with pytest.raises(m2.InvalidShapeError, match="cu_seqlens_q"):
        call_record("attention", q, q, q, torch.tensor([0, 3], dtype=torch.int32), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="unknown op 'conv'"):
        call_record("conv", q)  # type: ignore[call-overload]


def test_records_are_namedtuples_not_dataclasses() -> None:
    """The hot path builds them with tuple.__new__ (a frozen dataclass costs several times more)."""
    for record in RECORDS.values():
        assert issubclass(record, tuple) and not dataclasses.is_dataclass(record)
