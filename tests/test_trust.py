"""Trust in the registry: the reference cannot be impersonated, changes are atomic, rules cannot be
bypassed by float thresholds, re-entrant or slow plugins are handled, ``core_api`` must say something."""

from __future__ import annotations

import logging
import sys
import threading
import types
from importlib.metadata import EntryPoint, entry_points

import oracles
import pydantic
import pytest
import torch
from magi2_backend_reference.rmsnorm import reference_rmsnorm

import magi2_core as m2
from magi2_core import BackendSpec, Capability, Condition, Rule
from magi2_core.model.capability import Provenance
from magi2_core.ops.rmsnorm import RMSNormCall
from magi2_core.selection import registry
from magi2_core.selection.registry import REFERENCE_DIST, Registry
from magi2_core.selection.shadow import _reference_kernel
from magi2_core.testing import registered_backend
from magi2_core.testing.register import InProcessBackend


def _impostor_installed() -> bool:
    return any(ep.name == "acme" for ep in entry_points(group="magi2_core.backends"))


needs_impostor = pytest.mark.skipif(
    not _impostor_installed(), reason="tests/plugins/impostor is not installed (pip install -e tests/plugins/impostor)"
)


def _norm_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(6, 16, generator=g), torch.randn(1, 1, 16, generator=g)


@needs_impostor
def test_installed_impostor_cannot_become_the_reference() -> None:
    reg = Registry()
    backends = {b.entry_point: b for b in reg.backends()}
    assert backends["reference"].distribution == REFERENCE_DIST  # the genuine one, never quarantined
    quarantined = {(q.entry_point, q.distribution): q.reason for q in reg.quarantined()}
    assert "reserved" in quarantined[("acme", "magi2-backend-impostor")]
    assert "belongs to magi2-backend-reference" in quarantined[("reference", "magi2-backend-impostor")]
    for op in ("rmsnorm", "attention"):
        ref = reg.provider(op, "reference")
        assert ref is not None and ref.capability.backend == REFERENCE_DIST


@needs_impostor
def test_provider_reference_shadow_and_kit_run_the_genuine_reference() -> None:
    x, w = _norm_inputs()
    expected = oracles.rmsnorm(x, w, eps=1e-6, modality_sizes=None)
    for out in (m2.rmsnorm(x, w, provider="reference"), m2.rmsnorm(x, w)):  # forced, and the default CPU path
        assert out.abs().max() > 0.1
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    assert _reference_kernel("rmsnorm") is reference_rmsnorm  # what shadow compares with
    from magi2_core.testing.runner import run_kit

    report = run_kit(["reference"], ops=["rmsnorm"], devices=["cpu"])
    assert report.ok and report.results and all(r.case.provider == "reference" for r in report.results)


def test_in_process_backend_cannot_declare_a_reference_provider() -> None:
    cap = Capability(
        op="rmsnorm",
        name="reference",
        impl="magi2_backend_reference.rmsnorm:reference_rmsnorm",
        device_types=("*",),
        dtypes=("float32",),
        priority=1000,
    )
    with pytest.raises(ValueError, match="reserved"), registered_backend(cap, name="sneaky"):
        pass
    assert m2.get_registry().provider("rmsnorm", "reference").capability.backend == REFERENCE_DIST  # type: ignore[union-attr]


class _Tag:
    def __init__(self, tag: float) -> None:
        self.tag = tag

    def __call__(self, call: RMSNormCall) -> torch.Tensor:
        return torch.full(call.x.shape, self.tag)


def test_registry_changes_while_other_threads_call_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("magi2_race_kernels")
    mod.tag = _Tag(-7.0)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    cap = Capability(
        op="rmsnorm",
        name="racer",
        impl="magi2_race_kernels:tag",
        device_types=("cpu",),
        dtypes=("float32",),
        priority=10_000,
    )
    x, w = torch.randn(4, 8), torch.randn(1, 1, 8)
    errors: list[BaseException] = []
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            try:
                m2.rmsnorm(x, w)
            except BaseException as exc:  # every failure is the finding
                errors.append(exc)
                return

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(150):
            with registered_backend(cap, name="race"):
                pass
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert errors == []
    out = m2.rmsnorm(x, w)  # the unregistered provider's kernel must not stay cached
    assert not torch.equal(out, torch.full(x.shape, -7.0))


class _Vanishing:
    """Eligible, but its backend is unregistered while the resolver asks (as another thread would)."""

    def check(self, problem: object) -> list[object]:
        m2.get_registry().unregister("vanishing")
        return []

    def __call__(self, call: RMSNormCall) -> torch.Tensor:
        return torch.full(call.x.shape, -7.0)


def test_unregister_during_resolution_neither_crashes_nor_leaves_a_stale_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = types.ModuleType("magi2_vanishing_kernels")
    mod.kernel = _Vanishing()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    cap = Capability(
        op="rmsnorm",
        name="vanishing",
        impl="magi2_vanishing_kernels:kernel",
        device_types=("cpu",),
        dtypes=("float32",),
        priority=10_000,
    )
    spec = BackendSpec(name="vanishing", version="0", core_api=">=2.0,<3", providers=(cap,))
    m2.get_registry().register(InProcessBackend(spec), name="vanishing")
    x, w = torch.randn(4, 8), torch.randn(1, 1, 8)
    first = m2.rmsnorm(x, w)  # resolved from one consistent state (was: a bare AssertionError)
    assert torch.equal(first, torch.full(x.shape, -7.0))
    assert m2.get_registry().provider("rmsnorm", "vanishing") is None
    assert not torch.equal(m2.rmsnorm(x, w), first)  # the next call resolves again: no stale kernel


def test_float_threshold_on_an_integer_field_is_rejected() -> None:
    with pytest.raises(pydantic.ValidationError, match="integer problem field"):
        Condition(field="max_seqlen_q", op="lt", value=20.0)
    with pytest.raises(pydantic.ValidationError, match="integer problem field"):
        Condition(field="tokens", op="in", value=(1, "2"))
    assert Condition(field="max_seqlen_q", op="lt", value=20).boundaries() == (20, 21)
    Rule(
        id="ok",
        when=(Condition(field="dtype", op="eq", value="float16"),),
        reason="r",
        provenance=Provenance(kind="policy", source="test"),
    )


def _plugin(name: str, core_api: str = ">=2.0,<3") -> types.ModuleType:
    mod = types.ModuleType(f"plugin_{name}")

    def magi2_backend() -> BackendSpec:
        return BackendSpec(name=name, version="1", core_api=core_api, providers=())

    mod.magi2_backend = magi2_backend  # type: ignore[attr-defined]
    return mod


def test_empty_core_api_is_refused() -> None:
    reg = Registry(discover=False)
    reg.register(_plugin("vague", core_api=""), name="vague")
    (q,) = reg.quarantined()
    assert q.entry_point == "vague" and "core_api is empty" in q.reason and "'>=2.0,<3'" in q.reason


def test_slow_plugin_is_timed_and_warned(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(registry, "SLOW_LOAD_S", -1.0)  # every load counts as slow
    reg = Registry(discover=False)
    with caplog.at_level(logging.WARNING, logger="magi2_core"):
        reg.register(_plugin("sloth"), name="sloth")
    (backend,) = reg.backends()
    assert backend.load_seconds >= 0.0
    assert any("'sloth'" in r.message and "to import" in r.message for r in caplog.records)


REENTRANT = "magi2_reentrant_plugin"


def test_reentrant_plugin_does_not_poison_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = Registry()
    seen: list[int] = []
    original = EntryPoint.load

    def load(ep: EntryPoint) -> object:
        if ep.name != "reentrant":
            return original(ep)
        seen.append(len(m2.get_registry().providers("rmsnorm")))  # what a re-entrant plugin does at import
        return _plugin("reentrant").magi2_backend  # type: ignore[attr-defined]

    real = list(entry_points(group="magi2_core.backends"))
    fake = EntryPoint(name="reentrant", value="magi2_reentrant_plugin:magi2_backend", group="magi2_core.backends")
    monkeypatch.setattr(EntryPoint, "load", load)
    monkeypatch.setattr(registry, "entry_points", lambda group: [*real, fake])
    monkeypatch.setattr(registry, "_REGISTRY", fresh)
    assert {"reference", "reentrant"} <= {b.entry_point for b in fresh.backends()}
    assert seen == [0]  # the plugin saw the registry as it was while loading, and loading ran once
    assert not [q for q in fresh.quarantined() if "already registered" in q.reason]


def test_hand_built_registry_accepts_only_the_genuine_reference_module() -> None:
    import magi2_backend_reference.plugin as genuine

    reg = Registry(discover=False)
    fake = types.ModuleType("magi2_backend_reference_plugin_copy")
    fake.magi2_backend = genuine.magi2_backend  # type: ignore[attr-defined]
    reg.register(fake, "reference")  # the same descriptors, but not the distribution's entry point
    assert reg.provider("rmsnorm", "reference") is None and "reserved" in reg.quarantined()[0].reason
    reg = Registry(discover=False)
    reg.register(genuine, "reference")
    ref = reg.provider("rmsnorm", "reference")
    assert ref is not None and ref.capability.backend == REFERENCE_DIST and reg.quarantined() == ()
