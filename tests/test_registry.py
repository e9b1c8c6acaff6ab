"""Discovery, quarantine, allow/deny lists, contract versions, in-process registration."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from importlib.metadata import entry_points

import pydantic
import pytest
import torch

import magi2_core as m2
from magi2_core import BackendSpec, Capability, config
from magi2_core.selection.registry import Registry


def _plugin(name: str, *caps: Capability, core_api: str = ">=2.0,<3") -> types.ModuleType:
    mod = types.ModuleType(f"plugin_{name}")

    def magi2_backend() -> BackendSpec:
        return BackendSpec(name=name, version="1.2.3", core_api=core_api, providers=caps)

    mod.magi2_backend = magi2_backend  # type: ignore[attr-defined]
    return mod


def _cap(name: str = "toy", op: str = "rmsnorm", priority: int = 5) -> Capability:
    return Capability(
        op=op,
        name=name,
        impl="magi2_backend_reference.rmsnorm:reference_rmsnorm",  # type: ignore[arg-type]
        device_types=("cpu",),
        dtypes=("float32",),
        priority=priority,
    )


def test_reference_backend_is_discovered_through_its_entry_point() -> None:
    reg = Registry()
    names = {b.entry_point for b in reg.backends()}
    assert "reference" in names
    assert [p.name for p in reg.providers("attention")][-1] == "reference"


def test_example_third_party_backend_is_discovered_end_to_end() -> None:
    reg = Registry()
    backend = {b.entry_point: b for b in reg.backends()}.get("example")
    if backend is None:
        pytest.skip("tests/plugins/example is not installed (pip install -e tests/plugins/example)")
    assert backend.spec.name == "magi2-backend-example"
    fpga = reg.provider("attention", "example_fpga")
    assert fpga is not None and fpga.capability.device_types == ("fpga",)
    assert fpga.capability.backend == "magi2-backend-example" and fpga.capability.version == "0.0.1"


def test_broken_plugins_are_quarantined_with_reasons_and_ops_still_work() -> None:
    reg = Registry()
    q = {item.entry_point: item.reason for item in reg.quarantined()}
    if not q:
        pytest.skip("tests/plugins/broken is not installed (pip install -e tests/plugins/broken)")
    assert "magi2_no_such_native_extension" in q["broken_import"]
    assert "core contract >=9,<10" in q["broken_api"] and "provides contract 2.0" in q["broken_api"]
    assert "validation error" in q["broken_spec"]
    x = torch.randn(3, 8)
    assert m2.rmsnorm(x, torch.zeros(1, 1, 8)).shape == (3, 8)


def test_allow_list_and_deny_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGI2_PLUGINS", "reference")
    m2.reload_config()
    assert [b.entry_point for b in Registry().backends()] == ["reference"]
    # Only tests/plugins/impostor's "reference" entry point, when installed: the name is always checked.
    assert {q.distribution for q in Registry().quarantined()} <= {"magi2-backend-impostor"}
    monkeypatch.delenv("MAGI2_PLUGINS")
    monkeypatch.setenv("MAGI2_DISABLE_PLUGINS", "example, triton")
    m2.reload_config()
    names = {b.entry_point for b in Registry().backends()}
    assert "reference" in names and "example" not in names and "triton" not in names


def test_register_unregister_and_ordering() -> None:
    reg = Registry(discover=False)
    reg.register(
        _plugin("b-dist", _cap("zeta", priority=5), _cap("alpha", priority=5), _cap("top", priority=9)), name="b"
    )
    assert [p.name for p in reg.providers("rmsnorm")] == ["top", "alpha", "zeta"]  # priority, then name
    gen = reg.generation
    reg.unregister("b")
    assert reg.providers("rmsnorm") == [] and reg.generation > gen


def test_core_api_mismatch_quarantines() -> None:
    reg = Registry(discover=False)
    reg.register(_plugin("old", _cap(), core_api="<1.0"), name="old")
    (item,) = reg.quarantined()
    assert item.entry_point == "old" and "provides contract 2.0" in item.reason
    assert reg.providers("rmsnorm") == []


_API1 = "magi2_test_core_api_1_kernels"


def _api1_rmsnorm(
    x: torch.Tensor, weight: torch.Tensor, *, eps: float, modality_sizes: object, out_dtype: torch.dtype
) -> torch.Tensor:  # the core API 1 provider signature
    raise AssertionError("a kernel of a quarantined core API 1 backend was called")


def test_a_backend_built_for_core_api_1_is_quarantined_with_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = types.ModuleType(_API1)
    kernels.rmsnorm = _api1_rmsnorm  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, _API1, kernels)
    cap = Capability(
        op="rmsnorm",
        name="api1_rmsnorm",
        impl=f"{_API1}:rmsnorm",
        device_types=("cpu",),
        dtypes=("float32",),
        priority=1000,
    )
    reg = m2.get_registry()
    reg.register(_plugin("magi2-backend-api1", cap, core_api=">=1.0,<2"), name="api1")
    try:
        (item,) = [q for q in reg.quarantined() if q.entry_point == "api1"]
        assert item.reason == (
            "ValueError: built for core API 1, this is 2; providers now receive one call record "
            "(see docs/writing-a-backend.md); upgrade the backend"
        )
        assert "\n" not in item.reason
        x, w = torch.randn(3, 8), torch.zeros(1, 1, 8)
        assert m2.resolve("rmsnorm", x, w).chosen == "reference"  # the old provider is not considered
        torch.testing.assert_close(m2.rmsnorm(x, w), x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6))
    finally:
        reg.unregister("api1")
    assert not [q for q in reg.quarantined() if q.entry_point == "api1"]


def test_a_range_reaching_into_core_api_1_names_the_change_and_one_beyond_both_does_not() -> None:
    reg = Registry(discover=False)
    reg.register(_plugin("one-only", _cap(), core_api="==1.3"), name="one-only")
    reg.register(_plugin("future", _cap("future"), core_api=">=3,<4"), name="future")
    reasons = {q.entry_point: q.reason for q in reg.quarantined()}
    assert "built for core API 1, this is 2" in reasons["one-only"]
    assert "built for core API" not in reasons["future"] and "provides contract 2.0" in reasons["future"]


def test_duplicate_provider_names_quarantine_the_later_backend() -> None:
    reg = Registry(discover=False)
    reg.register(_plugin("first", _cap("same")), name="first")
    reg.register(_plugin("second", _cap("same")), name="second")
    assert [p.capability.backend for p in reg.providers("rmsnorm")] == ["first"]
    assert "already registered" in reg.quarantined()[0].reason


def test_an_unhashable_object_registers_like_a_module() -> None:
    """Pluggy kept plugins in sets (an unhashable one was refused); the registry only calls them."""
    reg = Registry(discover=False)
    unhashable = types.SimpleNamespace(
        magi2_backend=lambda: BackendSpec(name="ns", version="0", core_api=">=2.0,<3", providers=(_cap("from_ns"),))
    )
    reg.register(unhashable, name="ns")
    reg.register(_plugin("after", _cap("after")), name="after")
    assert reg.quarantined() == ()
    assert sorted(p.name for p in reg.providers("rmsnorm")) == ["after", "from_ns"]


def test_plugin_without_the_hook_is_quarantined() -> None:
    reg = Registry(discover=False)
    reg.register(types.ModuleType("empty"), name="empty")
    assert "magi2_backend" in reg.quarantined()[0].reason


def test_provider_import_failure_is_a_reason_not_an_exception() -> None:
    reg = Registry(discover=False)
    cap = Capability(
        op="rmsnorm", name="ghost", impl="no_such_module_xyz:kernel", device_types=("cpu",), dtypes=("float32",)
    )
    reg.register(_plugin("ghost", cap), name="ghost")
    impl, error = reg.providers("rmsnorm")[0].load()
    assert impl is None and error is not None and "no_such_module_xyz" in error


def test_descriptors_are_frozen_and_json_round_trip() -> None:
    cap = m2.get_registry().provider("attention", "reference")
    assert cap is not None
    c = cap.capability
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        c.priority = 3  # type: ignore[misc]
    assert Capability.model_validate_json(c.model_dump_json()) == c


def test_a_plugin_whose_import_hangs_is_quarantined_after_the_documented_limit() -> None:
    """tests/plugins/broken's ``broken_hang`` sleeps 60 s at import: the registry waits for it at most
    ``MAGI2_PLUGIN_IMPORT_TIMEOUT`` seconds, then goes on without it (in a fresh process: the import
    goes on in a background thread, holding that module's import lock)."""
    if "broken_hang" not in {ep.name for ep in entry_points(group="magi2_core.backends")}:
        pytest.skip("tests/plugins/broken is not installed (pip install -e tests/plugins/broken)")
    code = (
        "import time, torch, magi2_core as m2\n"
        "from magi2_core.selection.registry import Registry\n"
        "start = time.perf_counter(); reg = Registry(); reg.backends()\n"
        "print(time.perf_counter() - start)\n"
        "print({q.entry_point: q.reason for q in reg.quarantined()}['broken_hang'])\n"
        "print(sorted(b.entry_point for b in reg.backends()))\n"
        "print(m2.rmsnorm(torch.randn(2, 8), torch.randn(1, 1, 8)).shape)\n"
    )
    env = {**os.environ, "BROKEN_PLUGIN_HANG_S": "60", "MAGI2_PLUGIN_IMPORT_TIMEOUT": "3"}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=55)
    assert result.returncode == 0, result.stderr[-2000:]
    seconds, reason, loaded, shape = result.stdout.strip().splitlines()
    assert 3.0 <= float(seconds) < 30.0 and time.perf_counter() - start < 55.0
    assert "did not finish within 3 s" in reason and "MAGI2_PLUGIN_IMPORT_TIMEOUT" in reason, reason
    assert "'reference'" in loaded and shape == "torch.Size([2, 8])"


def test_a_plugin_that_asks_for_the_registry_while_it_is_imported_sees_it_so_far() -> None:
    """The import runs in a helper thread while the loading thread holds the registry's lock: the
    helper must not wait for that lock (it would, until the import limit, and be quarantined)."""
    reg = Registry(discover=False)
    seen: list[int] = []

    class Reentrant:
        name, value, dist = "reentrant", "reentrant_plugin", None

        def load(self) -> types.ModuleType:
            seen.append(len(reg.providers("rmsnorm")))
            return _plugin("reentrant", _cap("inside"))

    with reg._lock:  # as _ensure_loaded holds it while it imports
        plugin, failure = reg._import(Reentrant(), 30.0)
    assert failure is None and seen == [0] and isinstance(plugin, types.ModuleType)


def test_slow_backend_warning_says_how_to_drop_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from magi2_core.selection import registry

    monkeypatch.setattr(registry, "SLOW_LOAD_S", -1.0)  # every load counts as slow
    reg = Registry(discover=False)
    with caplog.at_level("INFO", logger="magi2_core"):
        reg.register(_plugin("sloth", _cap("sloth")), name="sloth")
    (record,) = [r for r in caplog.records if "'sloth'" in r.getMessage()]
    assert record.levelname == "WARNING" and "MAGI2_DISABLE_PLUGINS=sloth" in record.getMessage()


@pytest.mark.parametrize(
    ("var", "raw"), [("MAGI2_STRICT", "banana"), ("MAGI2_SHADOW", "abc"), ("MAGI2_CHECK_DEVICE_VALUES", "maybe")]
)
def test_every_variable_is_validated_before_the_first_backend_loads(
    monkeypatch: pytest.MonkeyPatch, var: str, raw: str
) -> None:
    """A bad value is the caller's ConfigError, even for a variable that this process would read only
    on an accelerator (MAGI2_STRICT) or that a backend's import reads first (MAGI2_SHADOW), never a
    backend quarantined for it."""
    monkeypatch.setattr(config, "_values", {})  # as in a fresh process: nothing read yet
    monkeypatch.setenv(var, raw)
    with pytest.raises(m2.ConfigError, match=f"{var}={raw!r}"):
        Registry().backends()
