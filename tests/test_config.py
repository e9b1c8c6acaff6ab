"""The configuration module: one parser per MAGI2_* variable, clear errors, reload, the generated page."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
import torch

import magi2_core as m2
from magi2_core import config
from magi2_core.contracts._checks import device_value_checks
from magi2_core.selection import shadow
from magi2_core.selection.registry import Registry

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("var", "raw", "accepted"),
    [
        ("MAGI2_SHADOW", "nan", "a number in [0, 1]"),
        ("MAGI2_SHADOW", "2", "a number in [0, 1]"),
        ("MAGI2_SHADOW", "abc", "a number in [0, 1]"),
        ("MAGI2_SHADOW_RAISE", "maybe", "1, true"),
        ("MAGI2_CHECK_DEVICE_VALUES", "2", "1, true"),
        ("MAGI2_DETERMINISTIC", "y", "1, true"),
        ("MAGI2_STRICT", "enabled", "1, true"),
        ("MAGI2_PLUGINS", "", "backend entry points"),
        ("MAGI2_PLUGINS", "reference,,triton", "backend entry points"),
        ("MAGI2_PLUGINS", "reference,tirton", "installed"),
        ("MAGI2_DISABLE_PLUGINS", "reference", "not `reference`"),
        ("MAGI2_ATTENTION_PROVIDER", "fa3, triton", "one provider name"),
        ("MAGI2_MATE_BACKEND", "fast", "auto | mutlass | mubin"),
    ],
)
def test_bad_value_names_the_variable_and_what_is_accepted(
    monkeypatch: pytest.MonkeyPatch, var: str, raw: str, accepted: str
) -> None:
    m2.get_registry().state()  # the backends' settings (MAGI2_MATE_*) are declared once they have loaded
    before, generation = config.effective(), config.generation
    monkeypatch.setenv(var, raw)
    with pytest.raises(m2.ConfigError) as info:
        m2.reload_config()
    assert isinstance(info.value, ValueError) and info.value.variable == var
    assert var in str(info.value) and repr(raw) in str(info.value) and accepted in str(info.value)
    assert config.generation == generation  # a failed reload changes nothing
    with pytest.raises(m2.ConfigError, match=var):  # and every read refuses the value until it is put right
        config.get("MAGI2_SHADOW")
    monkeypatch.undo()
    assert config.effective() == before


@pytest.mark.parametrize(("raw", "value"), [("true", True), ("1", True), ("ON", True), ("no", False), ("0", False)])
def test_booleans_accept_the_documented_spellings(monkeypatch: pytest.MonkeyPatch, raw: str, value: bool) -> None:
    monkeypatch.setenv("MAGI2_SHADOW_RAISE", raw)
    monkeypatch.setenv("MAGI2_CHECK_DEVICE_VALUES", raw)
    m2.reload_config()
    assert config.get("MAGI2_SHADOW_RAISE") is value and device_value_checks() is value


def test_shadow_raise_true_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGI2_SHADOW", "0.25")
    monkeypatch.setenv("MAGI2_SHADOW_RAISE", "true")
    m2.reload_config()
    assert shadow.is_active() and shadow.settings() == (0.25, True)
    monkeypatch.delenv("MAGI2_SHADOW")
    monkeypatch.delenv("MAGI2_SHADOW_RAISE")
    m2.reload_config()
    assert not shadow.is_active()


def test_a_write_to_os_environ_is_seen_by_the_next_read(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config.get("MAGI2_DETERMINISTIC") is False
    generation = config.generation
    os.environ["MAGI2_DETERMINISTIC"] = "1"  # no reload_config() after it
    try:
        assert config.get("MAGI2_DETERMINISTIC") is True
        assert config.generation == generation + 1  # the caches that follow the config were told
        os.environ["MAGI2_UNDECLARED_THING"] = "x"  # an undeclared name: noticed, nothing to refresh
        assert config.get("MAGI2_DETERMINISTIC") is True and config.generation == generation + 1
        os.environ["PATH"] = os.environ["PATH"]  # not a MAGI2_* key: not even counted
        assert config.WATCH.writes == config.WATCH.synced
    finally:
        os.environ.pop("MAGI2_UNDECLARED_THING", None)
        del os.environ["MAGI2_DETERMINISTIC"]
    assert config.get("MAGI2_DETERMINISTIC") is False


def test_os_environ_stays_the_same_object_of_a_subclass_of_its_class() -> None:
    assert isinstance(os.environ, os._Environ) and getattr(type(os.environ), "_magi2_watched", False)
    assert config.watch_environ()  # installing again is a no-op
    assert type(os.environ).__mro__[1] is os._Environ
    os.environ.update(MAGI2_STRICT="1")  # MutableMapping's methods go through __setitem__
    try:
        assert config.get("MAGI2_STRICT") is True
    finally:
        os.environ.pop("MAGI2_STRICT")
    assert config.get("MAGI2_STRICT") is False


def test_empty_value_is_unset_except_for_the_allow_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGI2_SHADOW", "  ")
    monkeypatch.setenv("MAGI2_ATTENTION_PROVIDER", "")
    assert m2.reload_config()["MAGI2_SHADOW"] == 0.0
    assert config.get("MAGI2_ATTENTION_PROVIDER") is None


def test_unknown_variable_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="MAGI2_NOPE"):
        config.get("MAGI2_NOPE")


def test_set_device_value_checks_takes_booleans_only() -> None:
    with pytest.raises(m2.InvalidValueError, match="True, False or None"):
        m2.set_device_value_checks("no")  # type: ignore[arg-type]
    previous = m2.set_device_value_checks(True)
    try:
        assert device_value_checks() is True
    finally:
        assert m2.set_device_value_checks(previous) is True
    assert device_value_checks() is (config.get("MAGI2_CHECK_DEVICE_VALUES") if previous is None else previous)


def test_disabling_everything_still_leaves_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGI2_PLUGINS", "example")
    m2.reload_config()
    names = [b.entry_point for b in Registry().backends()]
    assert "reference" in names
    assert m2.rmsnorm(torch.randn(3, 8), torch.randn(1, 1, 8), provider="reference").shape == (3, 8)


def test_allow_list_typo_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGI2_PLUGINS", "refrence")
    with pytest.raises(m2.ConfigError, match=r"MAGI2_PLUGINS='refrence'.*not installed: \['refrence'\]"):
        m2.reload_config()


def test_an_env_provider_override_set_after_a_call_applies_to_the_next_call(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w = torch.randn(2, 8), torch.randn(1, 1, 8)
    m2.rmsnorm(x, w)  # fills the resolution cache and the bound-call cache
    monkeypatch.setenv("MAGI2_RMSNORM_PROVIDER", "no_such_provider")  # no reload_config()
    with pytest.raises(m2.UnknownProviderError, match="no_such_provider"):
        m2.rmsnorm(x, w)
    monkeypatch.delenv("MAGI2_RMSNORM_PROVIDER")
    assert m2.rmsnorm(x, w).shape == (2, 8)


def test_a_backend_load_variable_changed_after_load_is_refused_until_reload(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w = torch.randn(2, 8), torch.randn(1, 1, 8)
    m2.rmsnorm(x, w)  # the backends are loaded
    assert "example" in [b.entry_point for b in m2.get_registry().backends()]
    monkeypatch.setenv("MAGI2_DISABLE_PLUGINS", "example")
    with pytest.raises(m2.ConfigChangeError, match="MAGI2_DISABLE_PLUGINS") as info:
        m2.rmsnorm(x, w)
    assert "backend load" in str(info.value) and "reload_config()" in str(info.value)
    with pytest.raises(m2.ConfigChangeError, match="MAGI2_DISABLE_PLUGINS"):
        config.get("MAGI2_STRICT")  # every read refuses it, not only the op calls
    m2.reload_config()  # reloads the backends with the new value
    assert "example" not in [b.entry_point for b in m2.get_registry().backends()]
    assert m2.rmsnorm(x, w).shape == (2, 8)


def test_every_magi2_variable_in_the_sources_is_declared() -> None:
    import re

    pattern = re.compile(r"MAGI2_[A-Z0-9_]+")
    seen: set[str] = set()
    for path in [*ROOT.joinpath("magi2_core").rglob("*.py"), *ROOT.joinpath("backends").rglob("src/**/*.py")]:
        seen |= set(pattern.findall(path.read_text(encoding="utf-8")))
    family = {f"MAGI2_{k}_PROVIDER" for k in ("OP",)}  # placeholders in docstrings
    declared = {v.name for v in gen_config_doc().declarations()}  # the core's, the integration's, the backends'
    assert seen - family <= declared, sorted(seen - family - declared)


def gen_config_doc() -> Any:
    spec = importlib.util.spec_from_file_location("gen_config_doc", ROOT / "scripts" / "gen_config_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_configuration_page_matches_the_declarations() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == gen_config_doc().render(), (
        "docs/configuration.md is stale: run python scripts/gen_config_doc.py"
    )


def test_magi2_deterministic_is_the_default_of_attention_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """``deterministic=None`` (the default) reads MAGI2_DETERMINISTIC in attention as in moe_experts: the
    resolution asks for the feature and the chosen kernel is called with ``deterministic=True``."""
    import sys
    import types

    from magi2_core import BackendSpec, Capability, Feature
    from magi2_core.ops.attention import AttentionCall

    seen: list[bool] = []

    def kernel(call: AttentionCall) -> tuple[torch.Tensor, None]:
        seen.append(call.deterministic)
        return torch.zeros_like(call.q), None

    module = types.ModuleType("magi2_toy_det_attention")
    module.kernel = kernel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    cap = Capability(
        op="attention",
        name="toy_det",
        impl=f"{module.__name__}:kernel",
        device_types=("cpu",),
        dtypes=("float32",),
        features=frozenset({Feature.DETERMINISTIC}),
        priority=-50,
    )
    registry = m2.get_registry()
    registry.register(BackendSpec(name="toy-det", version="0", core_api=">=2.0,<3", providers=(cap,)), "toy_det")
    q, k, v = (torch.randn(6, 2, 8) for _ in range(3))
    cu = torch.tensor([0, 6], dtype=torch.int32)
    try:
        assert Feature.DETERMINISTIC not in m2.resolve("attention", q, k, v, cu, cu).problem.features
        m2.attention(q, k, v, cu, cu, provider="toy_det")
        os.environ["MAGI2_DETERMINISTIC"] = "1"  # after a first call, without reload_config()
        assert Feature.DETERMINISTIC in m2.resolve("attention", q, k, v, cu, cu).problem.features
        off = m2.resolve("attention", q, k, v, cu, cu, deterministic=False)
        assert Feature.DETERMINISTIC not in off.problem.features
        m2.attention(q, k, v, cu, cu, provider="toy_det")
        m2.attention(q, k, v, cu, cu, provider="toy_det", deterministic=False)
        assert seen == [False, True, False]
    finally:
        registry.unregister("toy_det")
        os.environ.pop("MAGI2_DETERMINISTIC", None)


def test_get_and_current_follow_the_environment_on_every_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAGI2_STRICT", raising=False)
    assert config.current("MAGI2_STRICT") is False
    monkeypatch.setenv("MAGI2_STRICT", "1")
    assert config.current("MAGI2_STRICT") is True  # no reload_config() between
    assert config.get("MAGI2_STRICT") is True  # the cached value follows the last read
    monkeypatch.setenv("MAGI2_STRICT", "maybe")
    with pytest.raises(m2.ConfigError, match="MAGI2_STRICT"):
        config.current("MAGI2_STRICT")
    monkeypatch.delenv("MAGI2_STRICT")
    assert config.current("MAGI2_STRICT") is False
    with pytest.raises(KeyError, match="MAGI2_NO_SUCH"):
        config.current("MAGI2_NO_SUCH")
