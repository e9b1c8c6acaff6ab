"""No silent slow path: the DEBUG resolution log, the WARNING for the reference on an accelerator,
and strict mode (``MAGI2_STRICT=1`` / ``m2.set_strict``) raising with every faster provider's reasons.

A CPU machine has no accelerator, so the calls are ``moe_route`` problems on a made-up accelerator
type ``npu`` posed straight to a :class:`Dispatcher` over a registry of the installed backends (whose
``reference`` serves any device) plus a toy ``fast_npu`` provider whose run-time check rejects the call.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterator, Sequence

import pytest
import torch

import magi2_core as m2
from magi2_core import BackendSpec, Capability, Problem
from magi2_core.errors import ResolutionError, StrictModeError
from magi2_core.ops.moe_route import SPEC as MOE_ROUTE
from magi2_core.ops.moe_route import RouteCall, RouteKey
from magi2_core.reasons import Reason, ReasonCode
from magi2_core.selection import dispatch as _dispatch
from magi2_core.selection import strict
from magi2_core.selection.dispatch import Dispatcher
from magi2_core.selection.registry import Registry

MOD = "magi2_strict_toy"


class Kernel:
    def __init__(self, unavailable: bool = False) -> None:
        self.unavailable = unavailable

    def check(self, problem: Problem) -> Sequence[Reason]:
        if self.unavailable:
            return [Reason(code=ReasonCode.UNAVAILABLE, field="toy_driver", expected="loaded", actual="missing")]
        return []

    def __call__(self, call: RouteCall) -> torch.Tensor:
        return call.x


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    monkeypatch.setattr(strict, "_STRICT", None)  # follow the environment unless a test calls set_strict
    mod = types.ModuleType(MOD)
    mod.fast = Kernel(unavailable=True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MOD, mod)
    caps = (
        Capability(
            op="moe_route", name="fast_npu", impl=f"{MOD}:fast", device_types=("npu",), dtypes=("float32",), priority=20
        ),
    )
    plugin = types.ModuleType("strict_toy_plugin")

    def magi2_backend() -> BackendSpec:
        return BackendSpec(name="strict-toy", version="0.0.0", core_api=">=2.0,<3", providers=caps)

    plugin.magi2_backend = magi2_backend  # type: ignore[attr-defined]
    reg = Registry()  # the installed backends: the reference serves any device type
    reg.register(plugin, name="strict_toy")
    yield reg
    m2.set_strict(False)  # also clears the process-wide dispatcher cache


def _resolve(disp: Dispatcher, device: str, provider: str | None = None) -> object:
    key = RouteKey(device, "float32", None, 0, 64, 2, 8, 2, 16)
    return disp.kernel(MOE_ROUTE, key, provider).kernel


def test_debug_line_per_new_key(registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    disp = Dispatcher(registry)
    with caplog.at_level(logging.DEBUG, logger="magi2_core"):
        _resolve(disp, "cpu")
        _resolve(disp, "cpu")  # cached: no second line
        _resolve(disp, "cpu", provider="reference")  # a new key (the argument is part of it)
    lines = [r for r in caplog.records if r.levelno == logging.DEBUG and r.name == "magi2_core"]
    assert len(lines) == 2
    assert "moe_route" in lines[0].getMessage() and "-> reference" in lines[0].getMessage()
    assert "decided by priority" in lines[0].getMessage() and "decided by argument" in lines[1].getMessage()


def test_warning_once_per_key_for_the_reference_on_an_accelerator(
    registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    disp = Dispatcher(registry)
    with caplog.at_level(logging.WARNING, logger="magi2_core"):
        for _ in range(3):
            _resolve(disp, "npu")
        _resolve(disp, "cpu")  # the reference on the CPU is not a slow path
        _resolve(disp, "npu", provider="reference")  # forced on purpose: not a fallback
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "moe_route on npu" in warnings[0] and "fast_npu" in warnings[0] and "toy_driver" in warnings[0]


def test_set_strict_raises_naming_every_rejected_provider(registry: Registry) -> None:
    disp = Dispatcher(registry)
    m2.set_strict(True)
    with pytest.raises(StrictModeError) as err:
        _resolve(disp, "npu")
    assert isinstance(err.value, ResolutionError)
    msg = str(err.value)
    assert "fast_npu" in msg and "[unavailable] toy_driver: needs loaded, got missing" in msg
    assert err.value.resolution is not None and err.value.resolution.chosen == "reference"
    assert _resolve(disp, "cpu") is not None  # the CPU still resolves to the reference
    assert _resolve(disp, "npu", provider="reference") is not None  # so does an explicit choice
    with pytest.raises(StrictModeError):  # a raising key is never cached: it raises every time
        _resolve(disp, "npu")
    m2.set_strict(False)
    assert _resolve(disp, "npu") is not None


def test_env_variable_turns_strict_mode_on(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    disp = Dispatcher(registry)
    monkeypatch.setenv("MAGI2_STRICT", "1")
    m2.reload_config()
    try:
        with pytest.raises(StrictModeError):
            _resolve(disp, "npu")
        m2.set_strict(False)  # the function overrides the environment
        assert _resolve(disp, "npu") is not None
    finally:
        monkeypatch.delenv("MAGI2_STRICT")
        m2.reload_config()


def test_set_strict_clears_decisions_cached_before_it(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reference decision cached while strict mode was off is judged again once it is on."""
    disp = Dispatcher(registry)
    monkeypatch.setattr(_dispatch, "_DISPATCHER", disp)  # set_strict clears the ops' dispatcher: this one
    assert _resolve(disp, "npu") is not None  # cached (with a warning)
    m2.set_strict(True)
    with pytest.raises(StrictModeError):
        _resolve(disp, "npu")


@pytest.mark.gpu
def test_strict_mode_on_a_real_gpu_names_the_rejected_providers() -> None:
    """FP32 attention on CUDA has no fast provider (FA3 and torch varlen are BF16/FP16): strict refuses it."""
    q = torch.randn(64, 2, 64, device="cuda")
    cu = torch.tensor([0, 64], dtype=torch.int32, device="cuda")
    m2.set_strict(True)
    try:
        with pytest.raises(StrictModeError) as err:
            m2.attention(q, q, q, cu, cu, max_seqlen_q=64, max_seqlen_k=64)
        assert "torch_varlen" in str(err.value) and "[dtype]" in str(err.value)
        x = torch.randn(64, 1, 16, device="cuda", dtype=torch.bfloat16)
        _, idx = m2.moe_route(x, torch.randn(8, 16, device="cuda"), None, top_k=2)  # a kernel serves it
        assert idx.shape == (1, 64, 2)
    finally:
        m2.set_strict(False)


@pytest.mark.parametrize("value", ["no", "yes", "false", 1, 0, 1.0])
def test_set_strict_takes_booleans_only(monkeypatch: pytest.MonkeyPatch, value: object) -> None:
    """``bool("no")`` is True: a string must be refused, not read as strict mode on."""
    monkeypatch.setattr(strict, "_STRICT", None)
    with pytest.raises(m2.InvalidValueError, match=r"'enabled' must be True, False or None"):
        m2.set_strict(value)  # type: ignore[arg-type]
    assert strict._STRICT is None


def test_set_strict_returns_the_previous_setting_and_none_follows_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(strict, "_STRICT", None)
    assert m2.set_strict(True) is None and strict.is_strict()
    assert m2.set_strict(False) is True and not strict.is_strict()
    monkeypatch.setenv("MAGI2_STRICT", "1")
    m2.reload_config()
    try:
        assert m2.set_strict(None) is False and strict.is_strict()  # the variable rules again
    finally:
        monkeypatch.delenv("MAGI2_STRICT")
        m2.reload_config()
