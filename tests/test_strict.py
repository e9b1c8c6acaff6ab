"""No silent slow path: the DEBUG resolution log, the WARNING for the reference on an accelerator,
and strict mode (``MAGI2_STRICT=1`` / ``m2.set_strict``) raising with every faster provider's reasons.

A CPU machine has no accelerator, so the calls are posed as ``cuda`` problems straight to a
:class:`Dispatcher` over a private registry: a ``reference`` provider that serves any device and a
faster ``fast_cuda`` provider whose run-time check rejects the call.
"""

from __future__ import annotations

import logging
import sys
import types
from collections.abc import Iterator, Sequence

import pytest
import torch

import magi2_core as m2
from magi2_core import BackendSpec, Capability, Problem, hookimpl, strict
from magi2_core.errors import ResolutionError, StrictModeError
from magi2_core.registry import Registry
from magi2_core.resolution import Reason, ReasonCode
from magi2_core.resolver import Dispatcher

MOD = "magi2_strict_toy"
FIELDS = ("tokens", "width", "num_modalities", "num_patterns")


class Kernel:
    def __init__(self, unavailable: bool = False) -> None:
        self.unavailable = unavailable

    def check(self, problem: Problem) -> Sequence[Reason]:
        if self.unavailable:
            return [Reason(code=ReasonCode.UNAVAILABLE, field="toy_driver", expected="loaded", actual="missing")]
        return []

    def __call__(self, x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return x


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    monkeypatch.setattr(strict, "_STRICT", None)  # follow the environment unless a test calls set_strict
    mod = types.ModuleType(MOD)
    mod.ref = Kernel()  # type: ignore[attr-defined]
    mod.fast = Kernel(unavailable=True)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MOD, mod)
    caps = (
        Capability(op="rmsnorm", name="reference", impl=f"{MOD}:ref", device_types=("*",), dtypes=("float32",),
                   priority=0),
        Capability(op="rmsnorm", name="fast_cuda", impl=f"{MOD}:fast", device_types=("cuda",),
                   dtypes=("float32",), priority=20),
    )
    plugin = types.ModuleType("strict_toy_plugin")

    @hookimpl
    def magi2_backend() -> BackendSpec:
        return BackendSpec(name="strict-toy", version="0.0.0", core_api=">=1.0,<2", providers=caps)

    plugin.magi2_backend = magi2_backend  # type: ignore[attr-defined]
    reg = Registry(discover=False)
    reg.register(plugin, name="strict_toy")
    yield reg
    m2.set_strict(False)  # also clears the process-wide dispatcher cache


def _resolve(disp: Dispatcher, device: str, tokens: int = 64, provider: str | None = None) -> object:
    raw = (device, "float32", "float32", 0, tokens, 128, 1, 1)

    def build(r: tuple[object, ...]) -> Problem:
        return Problem(op="rmsnorm", device_type=str(r[0]), dtype="float32", tokens=tokens, width=128,
                       num_modalities=1, num_patterns=1, out_dtype="float32")

    return disp.kernel("rmsnorm", raw, FIELDS, build, provider)


def test_debug_line_per_new_key(registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    disp = Dispatcher(registry)
    with caplog.at_level(logging.DEBUG, logger="magi2_core"):
        _resolve(disp, "cpu")
        _resolve(disp, "cpu")  # cached: no second line
        _resolve(disp, "cpu", provider="reference")  # a new key (the argument is part of it)
    lines = [r for r in caplog.records if r.levelno == logging.DEBUG and r.name == "magi2_core"]
    assert len(lines) == 2
    assert "rmsnorm" in lines[0].getMessage() and "-> reference" in lines[0].getMessage()
    assert "decided by priority" in lines[0].getMessage() and "decided by argument" in lines[1].getMessage()


def test_warning_once_per_key_for_the_reference_on_an_accelerator(
    registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    disp = Dispatcher(registry)
    with caplog.at_level(logging.WARNING, logger="magi2_core"):
        for _ in range(3):
            _resolve(disp, "cuda")
        _resolve(disp, "cpu")  # the reference on the CPU is not a slow path
        _resolve(disp, "cuda", provider="reference")  # forced on purpose: not a fallback
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "rmsnorm on cuda" in warnings[0] and "fast_cuda" in warnings[0] and "toy_driver" in warnings[0]


def test_set_strict_raises_naming_every_rejected_provider(registry: Registry) -> None:
    disp = Dispatcher(registry)
    m2.set_strict(True)
    with pytest.raises(StrictModeError) as err:
        _resolve(disp, "cuda")
    assert isinstance(err.value, ResolutionError)
    msg = str(err.value)
    assert "fast_cuda" in msg and "[unavailable] toy_driver: needs loaded, got missing" in msg
    assert err.value.resolution is not None and err.value.resolution.chosen == "reference"
    assert _resolve(disp, "cpu") is not None  # the CPU still resolves to the reference
    assert _resolve(disp, "cuda", provider="reference") is not None  # so does an explicit choice
    with pytest.raises(StrictModeError):  # a raising key is never cached: it raises every time
        _resolve(disp, "cuda")
    m2.set_strict(False)
    assert _resolve(disp, "cuda") is not None


def test_env_variable_turns_strict_mode_on(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    disp = Dispatcher(registry)
    monkeypatch.setenv("MAGI2_STRICT", "1")
    m2.reload_config()
    try:
        with pytest.raises(StrictModeError):
            _resolve(disp, "cuda")
        m2.set_strict(False)  # the function overrides the environment
        assert _resolve(disp, "cuda") is not None
    finally:
        monkeypatch.delenv("MAGI2_STRICT")
        m2.reload_config()


def test_set_strict_clears_decisions_cached_before_it() -> None:
    """A reference decision cached while strict mode was off is judged again once it is on."""
    x, w = torch.randn(4, 8), torch.zeros(1, 1, 8)
    m2.rmsnorm(x, w)
    disp = m2.ops.dispatcher()
    assert disp._cache  # something was cached
    m2.set_strict(True)
    try:
        assert not disp._cache
        m2.rmsnorm(x, w)  # the CPU reference is allowed in strict mode
    finally:
        m2.set_strict(False)
