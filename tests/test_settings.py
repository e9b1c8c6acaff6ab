"""Backends declare their own MAGI2_* variables (``BackendSpec.settings``); a backend is one function.

Covers magi2_core.config's declare/withdraw/owner, the registry's quarantine of a conflicting setting
or a pluggy-style plugin, the sink-correction forcing that backends' settings carry, and the generated
configuration page's owners.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

import magi2_core as m2
from magi2_core import config
from magi2_core.model.backend_spec import BackendSpec, Setting, SinkCorrectionSpec, hookimpl
from magi2_core.selection.registry import Registry

ROOT = Path(__file__).resolve().parent.parent
OWNER = "magi2-backend-toy"


def _setting(name: str = "MAGI2_TOY_MODE", **kw: Any) -> Setting:
    fields: dict[str, Any] = {
        "kind": "choice",
        "choices": ("fast", "exact"),
        "default": "exact",
        "help": "the toy's mode",
    }
    return Setting(name=name, **(fields | kw))


def _backend(
    name: str, *settings: Setting, corrections: tuple[SinkCorrectionSpec, ...] = ()
) -> Callable[[], BackendSpec]:
    """What an entry point names: a function returning the whole spec."""
    return lambda: BackendSpec(
        name=name, version="0", core_api=">=2.0,<3", providers=(), settings=settings, sink_corrections=corrections
    )


@pytest.fixture
def declared() -> Iterator[list[str]]:
    """Owners this test declares under; every one is withdrawn afterwards, whatever the test did."""
    owners: list[str] = []
    yield owners
    for owner in owners:
        for _ in range(4):
            config.withdraw(owner)


# -- magi2_core.config ------------------------------------------------------------------------------
def test_declare_adds_a_variable_with_its_owner_and_withdraw_removes_it(
    declared: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    declared.append(OWNER)
    config.declare(_setting(), OWNER)
    assert config.owner("MAGI2_TOY_MODE") == OWNER and config.VARIABLES["MAGI2_TOY_MODE"].owner == OWNER
    assert config.get("MAGI2_TOY_MODE") == "exact"
    monkeypatch.setenv("MAGI2_TOY_MODE", "FAST")
    assert config.reload_config()["MAGI2_TOY_MODE"] == "fast"  # re-read with the core's variables
    config.withdraw(OWNER)
    assert config.owner("MAGI2_TOY_MODE") is None and "MAGI2_TOY_MODE" not in config.effective()
    with pytest.raises(KeyError, match="MAGI2_TOY_MODE is not a declared"):
        config.get("MAGI2_TOY_MODE")


def test_the_cores_own_variables_are_owned_by_the_core_and_never_withdrawn() -> None:
    assert config.owner("MAGI2_SHADOW") == config.CORE == "magi2-core"
    config.withdraw(config.CORE)
    assert config.owner("MAGI2_SHADOW") == config.CORE
    assert config.owner("MAGI2_NO_SUCH_VARIABLE") is None


def test_the_same_declaration_twice_is_counted_and_needs_two_withdrawals(declared: list[str]) -> None:
    declared.append(OWNER)
    config.declare(_setting(), OWNER)
    config.declare(_setting(), OWNER)  # the same backend loaded by a second registry
    config.withdraw(OWNER)
    assert config.owner("MAGI2_TOY_MODE") == OWNER
    config.withdraw(OWNER)
    assert config.owner("MAGI2_TOY_MODE") is None


def test_a_name_the_core_declares_is_a_conflict_naming_both_owners() -> None:
    with pytest.raises(
        config.SettingConflict,
        match=r"MAGI2_SHADOW is already declared by magi2-core; "
        r"magi2-backend-toy declares it too",
    ):
        config.declare(_setting("MAGI2_SHADOW"), OWNER)
    assert config.get("MAGI2_SHADOW") == 0.0  # the core's variable keeps its meaning


def test_another_owner_or_another_definition_is_a_conflict(declared: list[str]) -> None:
    declared.append(OWNER)
    config.declare(_setting(), OWNER)
    with pytest.raises(config.SettingConflict, match="already declared by magi2-backend-toy; magi2-backend-other"):
        config.declare(_setting(), "magi2-backend-other")
    with pytest.raises(config.SettingConflict, match="differently by the same owner"):
        config.declare(_setting(default="fast"), OWNER)


@pytest.mark.parametrize(
    ("kind", "raw", "value"),
    [("boolean", "Yes", True), ("boolean", "off", False), ("fraction", "0.25", 0.25), ("seconds", "12", 12.0)],
)
def test_each_kind_parses_like_the_cores_variables(kind: str, raw: str, value: object) -> None:
    var = config.variable(Setting(name="MAGI2_TOY_X", kind=kind, help="x"), OWNER)  # type: ignore[arg-type]
    assert var.parse(raw) == value and var.owner == OWNER
    parsers = {"boolean": config.boolean, "fraction": config.fraction, "seconds": config.seconds}
    assert var.accepted == parsers[kind].accepted


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"kind": "choice"}, "lists its choices"),
        ({"kind": "choice", "choices": ("a", "b"), "default": "c"}, "not one of"),
        ({"kind": "choice", "choices": ("Fast",)}, "never match"),
        ({"kind": "boolean", "choices": ("a",)}, "only a 'choice' setting"),
        ({"kind": "boolean", "default": "yes"}, "True, False or None"),
        ({"kind": "fraction", "default": 1.5}, "outside"),
        ({"kind": "seconds", "default": -1.0}, "outside"),
        ({"kind": "boolean", "forces_sink_correction_on": "musa"}, "'choice' of correction names"),
        ({"kind": "boolean", "name": "TOY_MODE"}, "MAGI2_"),
    ],
)
def test_an_inconsistent_setting_is_refused_when_built(fields: dict[str, Any], needle: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=needle):
        Setting(**({"name": "MAGI2_TOY_MODE", "help": "h"} | fields))


# -- the registry -----------------------------------------------------------------------------------
def test_a_loaded_backend_declares_its_settings_and_unregistering_withdraws_them(
    declared: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    declared.append(OWNER)
    reg = Registry(discover=False)
    reg.register(_backend(OWNER, _setting()), "toy")
    assert reg.quarantined() == () and config.owner("MAGI2_TOY_MODE") == OWNER
    monkeypatch.setenv("MAGI2_TOY_MODE", "nonsense")
    with pytest.raises(m2.ConfigError, match=r"MAGI2_TOY_MODE='nonsense'.*fast \| exact"):
        config.reload_config()
    reg.unregister("toy")
    assert config.owner("MAGI2_TOY_MODE") is None
    config.reload_config()  # the bad value no longer matters: nobody reads it


def test_a_conflicting_setting_quarantines_the_newcomer_only(declared: list[str]) -> None:
    declared.extend([OWNER, "magi2-backend-late"])
    reg = Registry(discover=False)
    reg.register(_backend(OWNER, _setting()), "toy")
    reg.register(_backend("magi2-backend-late", _setting("MAGI2_LATE_OWN"), _setting()), "late")
    (item,) = reg.quarantined()
    assert item.entry_point == "late"
    assert "MAGI2_TOY_MODE is already declared by magi2-backend-toy; magi2-backend-late declares it too" in item.reason
    assert config.owner("MAGI2_TOY_MODE") == OWNER
    assert config.owner("MAGI2_LATE_OWN") is None  # nothing of the refused backend is declared
    assert [b.entry_point for b in reg.backends()] == ["toy"]


def test_a_setting_declared_twice_in_one_spec_is_refused() -> None:
    reg = Registry(discover=False)
    reg.register(_backend("magi2-backend-twice", _setting(), _setting()), "twice")
    assert "more than once" in reg.quarantined()[0].reason and config.owner("MAGI2_TOY_MODE") is None


def test_backends_settings_fill_forced_by_and_a_second_forcer_is_quarantined(declared: list[str]) -> None:
    declared.extend(["magi2-backend-m1", "magi2-backend-m2"])
    force = {"choices": ("torch", "triton"), "default": "torch", "forces_sink_correction_on": "musa"}
    reg = Registry(discover=False)
    reg.register(_backend("magi2-backend-m1", _setting("MAGI2_M1_SINKS", **force)), "m1")
    reg.register(_backend("magi2-backend-m2", _setting("MAGI2_M2_SINKS", **force)), "m2")
    assert reg.state().forced_by == {"musa": "MAGI2_M1_SINKS"}
    (item,) = reg.quarantined()
    assert item.entry_point == "m2" and "MAGI2_M1_SINKS of magi2-backend-m1 already forces" in item.reason


def test_the_musa_backend_owns_its_variables_and_forces_the_musa_correction() -> None:
    reg = m2.get_registry()
    if "musa_mate" not in {b.entry_point for b in reg.backends()}:
        pytest.skip("magi2-backend-musa-mate is not installed")
    assert config.owner("MAGI2_MATE_BACKEND") == config.owner("MAGI2_MATE_SINK_CORRECTION") == "magi2-backend-musa-mate"
    assert reg.state().forced_by["musa"] == "MAGI2_MATE_SINK_CORRECTION"
    assert not hasattr(importlib.import_module("magi2_core.sink_correction.choice"), "FORCED_BY")


def test_a_bad_value_of_a_backends_variable_is_the_callers_error_and_nothing_stays_half_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MAGI2_MATE_BACKEND", "fast")
    monkeypatch.setattr(config, "_values", {})  # as in a fresh process
    reg = Registry()
    if "musa_mate" not in {ep.name for ep in importlib.metadata.entry_points(group="magi2_core.backends")}:
        pytest.skip("magi2-backend-musa-mate is not installed")
    with pytest.raises(m2.ConfigError, match=r"MAGI2_MATE_BACKEND='fast'.*auto \| mutlass \| mubin"):
        reg.state()
    monkeypatch.delenv("MAGI2_MATE_BACKEND")
    monkeypatch.setattr(config, "_values", {})
    names = [b.entry_point for b in reg.backends()]  # loads again, once, from scratch
    assert names.count("musa_mate") == 1 and "reference" in names


# -- one function per backend ------------------------------------------------------------------------
def test_a_pluggy_style_entry_point_is_quarantined_with_what_to_change() -> None:
    q = {item.entry_point: item.reason for item in Registry().quarantined()}
    if "broken_legacy" not in q:
        pytest.skip("tests/plugins/broken is not installed (pip install -e tests/plugins/broken)")
    reason = q["broken_legacy"]
    assert "pluggy-style plugin" in reason and "magi2_broken_backend.legacy:magi2_backend" in reason
    assert "magi2_sink_corrections" in reason and "sink_corrections=" in reason


def test_an_in_process_object_with_the_old_sink_hook_is_refused() -> None:
    legacy = types.SimpleNamespace(magi2_backend=_backend("magi2-backend-old"), magi2_sink_corrections=lambda: ())
    reg = Registry(discover=False)
    reg.register(legacy, "old")
    assert "register its magi2_backend function" in reg.quarantined()[0].reason and reg.backends() == []


@pytest.mark.parametrize("plugin", [42, types.ModuleType("empty")])
def test_something_that_is_not_a_backend_function_is_quarantined(plugin: object) -> None:
    reg = Registry(discover=False)
    reg.register(plugin, "odd")
    assert "not a function returning a BackendSpec" in reg.quarantined()[0].reason


def test_one_plugins_failure_stays_its_own() -> None:
    reg = Registry()
    q = {item.entry_point: item.reason for item in reg.quarantined()}
    if "broken_setting" not in q:
        pytest.skip("tests/plugins/broken is not installed (pip install -e tests/plugins/broken)")
    assert {"broken_import", "broken_api", "broken_spec", "broken_legacy", "broken_setting"} <= set(q)
    assert "MAGI2_SHADOW is already declared by magi2-core" in q["broken_setting"]
    loaded = {b.entry_point for b in reg.backends()}
    assert {"reference", "triton", "musa_mate", "cuda_fa3", "cuda_fa4"} <= loaded
    assert config.owner("MAGI2_SHADOW") == config.CORE


def test_a_backend_function_that_raises_is_quarantined_alone() -> None:
    def broken() -> BackendSpec:
        raise RuntimeError("no licence server")

    reg = Registry(discover=False)
    reg.register(broken, "broken")
    reg.register(_backend("magi2-backend-fine"), "fine")
    (item,) = reg.quarantined()
    assert item.entry_point == "broken" and "RuntimeError: no licence server" in item.reason
    assert [b.entry_point for b in reg.backends()] == ["fine"]


def test_sink_corrections_come_in_the_spec() -> None:
    spec = SinkCorrectionSpec(
        name="toy_sinks", impl="magi2_core.sink_correction.reference:apply_sink_correction", device_types=("cpu",)
    )
    reg = Registry(discover=False)
    reg.register(_backend("magi2-backend-sinks", corrections=(spec,)), "sinks")
    (got,) = reg.state().sink_corrections
    assert got.name == "toy_sinks" and got.backend == "magi2-backend-sinks"


def test_hookimpl_is_inert() -> None:
    def fn() -> int:
        return 1

    assert hookimpl(fn) is fn and hookimpl(tryfirst=True)(fn) is fn


def test_pluggy_is_neither_imported_nor_a_dependency() -> None:
    code = "import sys, magi2_core as m2; m2.get_registry().state(); print('pluggy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False"
    assert "pluggy" not in (ROOT / "pyproject.toml").read_text(encoding="utf-8")


# -- the generated page ------------------------------------------------------------------------------
def _gen_config_doc() -> Any:
    spec = importlib.util.spec_from_file_location("gen_config_doc", ROOT / "scripts" / "gen_config_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_page_names_each_variables_owner() -> None:
    page = _gen_config_doc().render()
    assert page == (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = {
        line.split(" | ")[0].strip("| `"): line.split(" | ")[1]
        for line in page.splitlines()
        if line.startswith("| `MAGI2_")
    }
    assert rows["MAGI2_SHADOW"] == "magi2-core"
    assert rows["MAGI2_MATE_BACKEND"] == rows["MAGI2_MATE_SINK_CORRECTION"] == "magi2-backend-musa-mate"
    assert rows["MAGI2_VLLM_OMNI"] == rows["MAGI2_ROUTER_BIAS_SOURCE"] == "magi2-core (vllm-omni integration)"
    assert "| ema \\| main |" in page  # a `|` inside a cell is escaped
    assert "MAGI2_TOY" not in page and "broken" not in page  # only what ships with magi2-core


def test_a_second_backend_under_a_taken_name_is_quarantined() -> None:
    reg = Registry(discover=False)
    reg.register(_backend("magi2-backend-first"), "same")
    reg.register(_backend("magi2-backend-second"), "same")
    assert "already registered (magi2-backend-first)" in reg.quarantined()[0].reason
    assert [b.spec.name for b in reg.backends()] == ["magi2-backend-first"]


def test_an_entry_point_naming_a_module_that_defines_the_function_still_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The form of the pluggy era without its extra hooks loses nothing, so it loads (an editable install
    made before the entry points named the function keeps working until it is reinstalled)."""
    from importlib.metadata import EntryPoint

    from magi2_core.selection import registry

    module = types.ModuleType("magi2_toy_module_plugin")
    module.magi2_backend = _backend("magi2-backend-module-form")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    fake = EntryPoint(name="module_form", value=module.__name__, group=registry.ENTRY_POINT_GROUP)
    real = [ep for ep in importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP) if ep.name == "reference"]
    monkeypatch.setattr(registry, "entry_points", lambda group: [*real, fake])
    reg = Registry()
    assert {b.entry_point for b in reg.backends()} == {"reference", "module_form"}
    assert "module_form" not in {q.entry_point for q in reg.quarantined()}


def test_magi2_backends_json_shows_a_backends_settings_and_their_values() -> None:
    import json

    from typer.testing import CliRunner

    from magi2_core.cli import app

    if "musa_mate" not in {b.entry_point for b in m2.get_registry().backends()}:
        pytest.skip("magi2-backend-musa-mate is not installed")
    result = CliRunner().invoke(app, ["backends", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    musa = next(b for b in data["backends"] if b["entry_point"] == "musa_mate")
    assert [s["name"] for s in musa["settings"]] == ["MAGI2_MATE_BACKEND", "MAGI2_MATE_SINK_CORRECTION"]
    assert data["config"]["MAGI2_MATE_SINK_CORRECTION"] in ("torch", "triton")


# -- when a backend's setting is read -------------------------------------------------------------
def test_a_backend_load_setting_changed_after_load_is_refused_until_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = m2.get_registry()
    registry.register(_backend(OWNER, _setting(read="backend load")), "toy")
    try:
        assert config.VARIABLES["MAGI2_TOY_MODE"].read is config.BACKEND_LOAD
        monkeypatch.setenv("MAGI2_TOY_MODE", "fast")
        with pytest.raises(m2.ConfigChangeError, match="MAGI2_TOY_MODE") as info:
            config.get("MAGI2_TOY_MODE")
        assert "'exact' stays in use" in str(info.value)
        m2.reload_config()  # reloads the backends: the registry forgets the in-process one
        assert "toy" not in [b.entry_point for b in registry.backends()]
    finally:
        registry.unregister("toy")


def test_an_every_call_setting_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = m2.get_registry()
    registry.register(_backend(OWNER, _setting()), "toy")
    try:
        assert config.get("MAGI2_TOY_MODE") == "exact"
        monkeypatch.setenv("MAGI2_TOY_MODE", "fast")
        assert config.get("MAGI2_TOY_MODE") == "fast"
    finally:
        registry.unregister("toy")


def test_a_backend_cannot_claim_the_plugin_load_moment() -> None:
    reg = Registry(discover=False)
    reg.register(_backend(OWNER, _setting(read="plugin load")), "toy")
    (item,) = reg.quarantined()
    assert "read='plugin load'" in item.reason and "MAGI2_TOY_MODE" in item.reason
