"""One test per input-validation error of the public ops (issue 2, item 1).

Each bad call must raise before any kernel runs, with the right ``magi2_core`` class (shape/value
errors are ``ValueError``s, dtype errors ``TypeError``s, device errors ``ValueError``s), and a message
that names the argument and says what would work. Mismatched devices use the ``meta`` device.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import magi2_core as m2
from magi2_core import (
    InvalidDeviceError,
    InvalidDTypeError,
    InvalidInputError,
    InvalidShapeError,
    InvalidValueError,
    Magi2Error,
    UnknownProviderError,
)

I32 = torch.int32


def _attn(**over: Any) -> Any:
    a: dict[str, Any] = {
        "q": torch.randn(6, 4, 8),
        "k": torch.randn(5, 2, 8),
        "v": torch.randn(5, 2, 8),
        "cu_seqlens_q": torch.tensor([0, 2, 6], dtype=I32),
        "cu_seqlens_k": torch.tensor([0, 3, 5], dtype=I32),
    }
    a.update(over)
    pos = [a.pop(n) for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")]
    return m2.attention(*pos, **a)


def _route(**over: Any) -> Any:
    a: dict[str, Any] = {
        "x": torch.randn(5, 2, 8),
        "router_weight": torch.randn(2 * 4, 8),
        "bias": torch.randn(2 * 4),
        "top_k": 2,
    }
    a.update(over)
    pos = [a.pop(n) for n in ("x", "router_weight", "bias")]
    return m2.moe_route(*pos, **a)


def _prepare(dtype: torch.dtype) -> Any:
    w = torch.ones(2 * 4, 8, 12, dtype=dtype)
    return m2.prepare_moe_weights(w, w.clone(), torch.ones(2 * 4, 12, 8, dtype=dtype))


def _experts(**over: Any) -> Any:
    t, hl, d, inter, k, e = 5, 2, 8, 12, 2, 4
    bf = torch.bfloat16
    a: dict[str, Any] = {
        "x": torch.randn(t, hl, d).to(bf),
        "probs": torch.rand(hl, t, k),
        "idx": torch.randint(0, e, (hl, t, k)),
        "w_gate": torch.randn(hl * e, d, inter).to(bf),
        "w_up": torch.randn(hl * e, d, inter).to(bf),
        "w_down": torch.randn(hl * e, inter, d).to(bf),
    }
    a.update(over)
    pos = [a.pop(n) for n in ("x", "probs", "idx", "w_gate", "w_up", "w_down")]
    return m2.moe_experts(*pos, **a)


def _norm(**over: Any) -> Any:
    a: dict[str, Any] = {"x": torch.randn(7, 4, 16), "weight": torch.randn(3, 4, 16), "modality_sizes": [2, 0, 5]}
    a.update(over)
    pos = [a.pop(n) for n in ("x", "weight")]
    return m2.rmsnorm(*pos, **a)


META = torch.device("meta")

# (id, call, error class, argument named, fragment of "what would work")
CASES: list[tuple[str, Callable[[], Any], type[InvalidInputError], str, str]] = [
    # attention
    ("attn-q-not-tensor", lambda: _attn(q=[[1.0]]), InvalidDTypeError, "q", "torch.Tensor"),
    ("attn-q-rank", lambda: _attn(q=torch.randn(6, 32)), InvalidShapeError, "q", "3-D"),
    ("attn-v-rank", lambda: _attn(v=torch.randn(5, 2, 8, 1)), InvalidShapeError, "v", "3-D"),
    ("attn-q-dtype", lambda: _attn(q=torch.randn(6, 4, 8, dtype=torch.float64)), InvalidDTypeError, "q", "bfloat16"),
    ("attn-q-int", lambda: _attn(q=torch.ones(6, 4, 8, dtype=I32)), InvalidDTypeError, "q", "float16"),
    ("attn-k-device", lambda: _attn(k=torch.randn(5, 2, 8, device=META)), InvalidDeviceError, "k", "cpu"),
    ("attn-v-device", lambda: _attn(v=torch.randn(5, 2, 8, device=META)), InvalidDeviceError, "v", "cpu"),
    (
        "attn-head-dim",
        lambda: _attn(k=torch.randn(5, 2, 16), v=torch.randn(5, 2, 16)),
        InvalidShapeError,
        "k/v",
        "head_dim 8",
    ),
    ("attn-v-shape", lambda: _attn(v=torch.randn(4, 2, 8)), InvalidShapeError, "v", "[5, 2, 8]"),
    (
        "attn-gqa-divisible",
        lambda: _attn(k=torch.randn(5, 3, 8), v=torch.randn(5, 3, 8)),
        InvalidShapeError,
        "k",
        "dividing q's 4 heads",
    ),
    (
        "attn-zero-kv-heads",
        lambda: _attn(k=torch.randn(5, 0, 8), v=torch.randn(5, 0, 8)),
        InvalidShapeError,
        "k",
        "dividing",
    ),
    ("attn-cu-not-tensor", lambda: _attn(cu_seqlens_q=[0, 2, 6]), InvalidDTypeError, "cu_seqlens_q", "torch.Tensor"),
    (
        "attn-cu-rank",
        lambda: _attn(cu_seqlens_q=torch.tensor([[0, 2, 6]], dtype=I32)),
        InvalidShapeError,
        "cu_seqlens_q",
        "1-D",
    ),
    (
        "attn-cu-empty",
        lambda: _attn(cu_seqlens_k=torch.tensor([], dtype=I32)),
        InvalidShapeError,
        "cu_seqlens_k",
        "B+1",
    ),
    (
        "attn-cu-dtype",
        lambda: _attn(cu_seqlens_q=torch.tensor([0.0, 2.0, 6.0])),
        InvalidDTypeError,
        "cu_seqlens_q",
        "int32",
    ),
    (
        "attn-cu-start",
        lambda: _attn(cu_seqlens_q=torch.tensor([1, 2, 6], dtype=I32)),
        InvalidShapeError,
        "cu_seqlens_q",
        "starting at 0",
    ),
    (
        "attn-cu-end",
        lambda: _attn(cu_seqlens_k=torch.tensor([0, 3, 4], dtype=I32)),
        InvalidShapeError,
        "cu_seqlens_k",
        "ending at k.shape[0] = 5",
    ),
    (
        "attn-cu-monotone",
        lambda: _attn(
            cu_seqlens_q=torch.tensor([0, 4, 3, 6], dtype=I32), cu_seqlens_k=torch.tensor([0, 1, 3, 5], dtype=I32)
        ),
        InvalidShapeError,
        "cu_seqlens_q",
        "non-decreasing",
    ),
    (
        "attn-cu-batch",
        lambda: _attn(cu_seqlens_k=torch.tensor([0, 1, 3, 5], dtype=I32)),
        InvalidShapeError,
        "cu_seqlens_k",
        "3 entries like cu_seqlens_q",
    ),
    (
        "attn-maxlen-small",
        lambda: _attn(max_seqlen_q=3),
        InvalidShapeError,
        "max_seqlen_q",
        ">= the longest segment (4)",
    ),
    ("attn-maxlen-negative", lambda: _attn(max_seqlen_k=-1), InvalidShapeError, "max_seqlen_k", "non-negative"),
    ("attn-maxlen-float", lambda: _attn(max_seqlen_k=8.0), InvalidShapeError, "max_seqlen_k", "Python int"),
    ("attn-scale-zero", lambda: _attn(softmax_scale=0.0), InvalidValueError, "softmax_scale", "finite positive"),
    ("attn-scale-nan", lambda: _attn(softmax_scale=math.nan), InvalidValueError, "softmax_scale", "finite positive"),
    ("attn-scale-inf", lambda: _attn(softmax_scale=math.inf), InvalidValueError, "softmax_scale", "finite positive"),
    ("attn-softcap-nan", lambda: _attn(softcap=math.nan), InvalidValueError, "softcap", "finite"),
    ("attn-softcap-inf", lambda: _attn(softcap=math.inf), InvalidValueError, "softcap", "<= 0 disables"),
    ("attn-sinks-not-tensor", lambda: _attn(sinks=[[0.0] * 4]), InvalidDTypeError, "sinks", "torch.Tensor"),
    ("attn-sinks-device", lambda: _attn(sinks=torch.randn(1, 4, device=META)), InvalidDeviceError, "sinks", "cpu"),
    (
        "attn-sink-rescale",
        lambda: _attn(sinks=torch.randn(1, 4), sink_rescale="bf16"),
        InvalidValueError,
        "sink_rescale",
        "'fp32' or 'activation'",
    ),
    # moe_route
    ("route-x-rank", lambda: _route(x=torch.randn(5, 16)), InvalidShapeError, "x", "3-D"),
    ("route-x-dtype", lambda: _route(x=torch.ones(5, 2, 8, dtype=torch.int64)), InvalidDTypeError, "x", "bfloat16"),
    (
        "route-weight-dtype",
        lambda: _route(router_weight=torch.randn(8, 8).bfloat16()),
        InvalidDTypeError,
        "router_weight",
        "float32",
    ),
    (
        "route-weight-width",
        lambda: _route(router_weight=torch.randn(8, 7)),
        InvalidShapeError,
        "router_weight",
        "[heads·experts, 8]",
    ),
    (
        "route-weight-rows",
        lambda: _route(router_weight=torch.randn(7, 8)),
        InvalidShapeError,
        "router_weight",
        "multiple of 2 rows",
    ),
    (
        "route-weight-rank",
        lambda: _route(router_weight=torch.randn(2, 4, 8)),
        InvalidShapeError,
        "router_weight",
        "FP32 [heads·experts, 8]",
    ),
    ("route-bias-shape", lambda: _route(bias=torch.randn(2, 4)), InvalidShapeError, "bias", "[8]"),
    ("route-bias-dtype", lambda: _route(bias=torch.randn(8).bfloat16()), InvalidDTypeError, "bias", "float32"),
    (
        "route-weight-device",
        lambda: _route(router_weight=torch.randn(8, 8, device=META)),
        InvalidDeviceError,
        "router_weight",
        "cpu",
    ),
    ("route-bias-device", lambda: _route(bias=torch.randn(8, device=META)), InvalidDeviceError, "bias", "cpu"),
    ("route-topk-too-large", lambda: _route(top_k=5), InvalidShapeError, "top_k", "[1, 4]"),
    ("route-topk-zero", lambda: _route(top_k=0), InvalidShapeError, "top_k", "[1, 4]"),
    ("route-topk-bool", lambda: _route(top_k=True), InvalidShapeError, "top_k", "an int"),
    ("route-topk-float", lambda: _route(top_k=2.0), InvalidShapeError, "top_k", "an int"),
    ("route-scale-nan", lambda: _route(route_scale=math.nan), InvalidValueError, "route_scale", "finite"),
    # moe_experts
    ("experts-x-rank", lambda: _experts(x=torch.randn(5, 16).bfloat16()), InvalidShapeError, "x", "3-D"),
    ("experts-x-dtype", lambda: _experts(x=torch.ones(5, 2, 8, dtype=I32)), InvalidDTypeError, "x", "bfloat16"),
    (
        "experts-probs-dtype",
        lambda: _experts(probs=torch.rand(2, 5, 2).bfloat16()),
        InvalidDTypeError,
        "probs",
        "float32",
    ),
    (
        "experts-probs-shape",
        lambda: _experts(probs=torch.rand(5, 2, 2), idx=torch.randint(0, 4, (5, 2, 2))),
        InvalidShapeError,
        "probs",
        "[2, 5, top_k]",
    ),
    ("experts-idx-dtype", lambda: _experts(idx=torch.rand(2, 5, 2)), InvalidDTypeError, "idx", "int32 or int64"),
    (
        "experts-idx-shape",
        lambda: _experts(idx=torch.randint(0, 4, (2, 5, 3))),
        InvalidShapeError,
        "idx",
        "[2, 5, 2] like probs",
    ),
    ("experts-idx-range", lambda: _experts(idx=torch.full((2, 5, 2), 4)), InvalidShapeError, "idx", "[0, 4)"),
    ("experts-idx-negative", lambda: _experts(idx=torch.full((2, 5, 2), -1)), InvalidShapeError, "idx", "[0, 4)"),
    (
        "experts-topk-too-large",
        lambda: _experts(probs=torch.rand(2, 5, 5), idx=torch.randint(0, 4, (2, 5, 5))),
        InvalidShapeError,
        "probs",
        "top_k <= 4",
    ),
    (
        "experts-w-gate-width",
        lambda: _experts(w_gate=torch.randn(8, 7, 12).bfloat16()),
        InvalidShapeError,
        "w_gate",
        "[heads·experts, 8, intermediate]",
    ),
    (
        "experts-w-gate-rows",
        lambda: _experts(w_gate=torch.randn(7, 8, 12).bfloat16()),
        InvalidShapeError,
        "w_gate",
        "multiple of 2 rows",
    ),
    (
        "experts-w-up-shape",
        lambda: _experts(w_up=torch.randn(8, 8, 10).bfloat16()),
        InvalidShapeError,
        "w_up",
        "[8, 8, 12] like w_gate",
    ),
    (
        "experts-w-down-shape",
        lambda: _experts(w_down=torch.randn(8, 8, 12).bfloat16()),
        InvalidShapeError,
        "w_down",
        "[8, 12, 8]",
    ),
    (
        "experts-w-dtype",
        lambda: _experts(w_down=torch.randn(8, 12, 8)),
        InvalidDTypeError,
        "w_down",
        "x's dtype bfloat16",
    ),
    (
        "experts-probs-device",
        lambda: _experts(probs=torch.rand(2, 5, 2, device=META)),
        InvalidDeviceError,
        "probs",
        "cpu",
    ),
    (
        "experts-w-device",
        lambda: _experts(w_up=torch.randn(8, 8, 12, device=META).bfloat16()),
        InvalidDeviceError,
        "w_up",
        "cpu",
    ),
    # rmsnorm
    ("norm-x-not-tensor", lambda: _norm(x=[1.0, 2.0]), InvalidDTypeError, "x", "torch.Tensor"),
    ("norm-x-dtype", lambda: _norm(x=torch.ones(7, 4, 16, dtype=torch.int64)), InvalidDTypeError, "x", "float32"),
    (
        "norm-x-rank",
        lambda: _norm(x=torch.randn(16), weight=torch.randn(1, 1, 16), modality_sizes=None),
        InvalidShapeError,
        "x",
        "at least 2-D",
    ),
    (
        "norm-weight-dtype",
        lambda: _norm(weight=torch.ones(3, 4, 16, dtype=I32)),
        InvalidDTypeError,
        "weight",
        "float32",
    ),
    (
        "norm-weight-device",
        lambda: _norm(weight=torch.randn(3, 4, 16, device=META)),
        InvalidDeviceError,
        "weight",
        "cpu",
    ),
    (
        "norm-sizes-tensor",
        lambda: _norm(modality_sizes=torch.tensor([2, 0, 5])),
        InvalidShapeError,
        "modality_sizes",
        "host-side list",
    ),
    ("norm-sizes-empty", lambda: _norm(modality_sizes=[]), InvalidShapeError, "modality_sizes", "non-empty"),
    (
        "norm-sizes-negative",
        lambda: _norm(modality_sizes=[3, -1, 5]),
        InvalidShapeError,
        "modality_sizes",
        "non-negative ints",
    ),
    (
        "norm-sizes-float",
        lambda: _norm(modality_sizes=[2.0, 0, 5]),
        InvalidShapeError,
        "modality_sizes",
        "non-negative ints",
    ),
    (
        "norm-sizes-sum",
        lambda: _norm(modality_sizes=[2, 1, 5]),
        InvalidShapeError,
        "modality_sizes",
        "summing to the token count x.shape[0] = 7",
    ),
    ("norm-weight-modalities", lambda: _norm(weight=torch.randn(2, 4, 16)), InvalidShapeError, "weight", "[3, P, 16]"),
    ("norm-weight-width", lambda: _norm(weight=torch.randn(3, 4, 8)), InvalidShapeError, "weight", "[3, P, 16]"),
    (
        "norm-weight-rank",
        lambda: _norm(weight=torch.randn(12, 16)),
        InvalidShapeError,
        "weight",
        "[3, P, 16] (modalities, patterns P, width), [3, 16] (P = 1), or flat [3·P·16]; P is the number",
    ),
    (
        "norm-flat-weight",
        lambda: _norm(weight=torch.randn(3 * 4 * 16 + 1)),
        InvalidShapeError,
        "weight",
        "or flat [3·P·16]",
    ),
    ("norm-patterns", lambda: _norm(weight=torch.randn(3, 2, 16)), InvalidShapeError, "x", "[tokens, ..., 2, 16]"),
    ("norm-patterns-2d-x", lambda: _norm(x=torch.randn(7, 16)), InvalidShapeError, "x", "[tokens, ..., 4, 16]"),
    ("norm-eps-negative", lambda: _norm(eps=-1e-6), InvalidValueError, "eps", "finite float >= 0"),
    ("norm-eps-nan", lambda: _norm(eps=math.nan), InvalidValueError, "eps", "finite float >= 0"),
    ("prepare-fp64", lambda: _prepare(torch.float64), InvalidDTypeError, "w_gate", "bfloat16 or float16 or float32"),
    ("prepare-int32", lambda: _prepare(torch.int32), InvalidDTypeError, "w_gate", "bfloat16 or float16 or float32"),
    ("prepare-bool", lambda: _prepare(torch.bool), InvalidDTypeError, "w_gate", "moe_experts' activation dtypes"),
]


@pytest.mark.parametrize(("call", "cls", "arg", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_a_clear_error(
    call: Callable[[], Any], cls: type[InvalidInputError], arg: str, fragment: str
) -> None:
    with pytest.raises(cls) as info:
        call()
    err = info.value
    assert type(err) is cls, f"{type(err).__name__}: {err}"
    assert err.arg == arg and f"argument '{arg}'" in str(err)
    assert fragment in err.expected, f"expected-text {err.expected!r} lacks {fragment!r}"
    assert err.actual and "; got " in str(err)  # says what was given


# Cases whose class the contracts get wrong today (reported to the lead, strict: they must flip).
MISCLASSIFIED: list[tuple[str, Callable[[], Any], type[InvalidInputError], str]] = [
    ("attn-k-dtype", lambda: _attn(k=torch.randn(5, 2, 8).bfloat16()), InvalidDTypeError, "k"),
    ("attn-sinks-dtype", lambda: _attn(sinks=torch.randn(1, 4).bfloat16()), InvalidDTypeError, "sinks"),
    ("attn-sinks-heads", lambda: _attn(sinks=torch.randn(1, 2)), InvalidShapeError, "sinks"),
    ("attn-sinks-rank", lambda: _attn(sinks=torch.randn(4)), InvalidShapeError, "sinks"),
    ("norm-out-dtype", lambda: _norm(out_dtype=torch.float64), InvalidDTypeError, "out_dtype"),
]


@pytest.mark.parametrize(("call", "cls", "arg"), [c[1:] for c in MISCLASSIFIED], ids=[c[0] for c in MISCLASSIFIED])
def test_rejected_with_a_clear_message(call: Callable[[], Any], cls: type[InvalidInputError], arg: str) -> None:
    """Rejected, naming the argument (whatever the class): this part already holds."""
    with pytest.raises(InvalidInputError) as info:
        call()
    assert info.value.arg == arg and f"argument '{arg}'" in str(info.value)


@pytest.mark.parametrize(("call", "cls", "arg"), [c[1:] for c in MISCLASSIFIED], ids=[c[0] for c in MISCLASSIFIED])
def test_rejected_with_the_right_class(call: Callable[[], Any], cls: type[InvalidInputError], arg: str) -> None:
    with pytest.raises(cls):
        call()


def test_error_family() -> None:
    assert issubclass(InvalidShapeError, ValueError) and issubclass(InvalidShapeError, Magi2Error)
    assert issubclass(InvalidDTypeError, TypeError) and issubclass(InvalidDTypeError, Magi2Error)
    assert issubclass(InvalidDeviceError, ValueError) and issubclass(InvalidDeviceError, Magi2Error)


def test_unknown_provider_lists_the_installed_ones() -> None:
    with pytest.raises(UnknownProviderError, match="reference") as info:
        _norm(provider="no_such_provider")
    assert isinstance(info.value, ValueError) and "no_such_provider" in str(info.value)


def test_resolve_validates_like_the_op() -> None:
    q = torch.randn(6, 4, 8)
    with pytest.raises(InvalidShapeError, match="cu_seqlens_q"):
        m2.resolve("attention", q, q, q, torch.tensor([0, 2, 5], dtype=I32), torch.tensor([0, 2, 6], dtype=I32))
