"""``magi2 env`` and the "usable here" column of ``magi2 backends``."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

import magi2_core
from magi2_core.cli import app

runner = CliRunner()


def test_env_json_reports_versions_devices_and_usable_providers() -> None:
    result = runner.invoke(app, ["env", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["magi2_core"] == {"version": magi2_core.__version__, "core_api": magi2_core.CORE_API_VERSION}
    assert report["torch"]["version"] == torch.__version__
    assert report["torch"]["cuda_available"] == torch.cuda.is_available()
    assert "cpu" in report["device_types_present"]
    assert set(report["kernel_builds"]) == {"FA3", "FA4", "FA2", "MATE"}
    assert any(b["distribution"] == "magi2-backend-reference" for b in report["backends"])
    by_name = {(p["op"], p["provider"]): p for p in report["providers"]}
    for op in ("attention", "moe_route", "moe_experts", "rmsnorm"):
        ref = by_name[(op, "reference")]
        assert ref["usable"] and "cpu" in ref["usable_on"] and ref["why_not"] == ""
    varlen = by_name[("attention", "torch_varlen")]
    if not torch.cuda.is_available():
        assert not varlen["usable"] and "needs cuda" in varlen["why_not"]


def test_env_text_names_each_section() -> None:
    result = runner.invoke(app, ["env"])
    assert result.exit_code == 0, result.output
    for needle in ("magi2-core", "torch", "triton", "MUSA", "FA3 builds", "usable here", "reference"):
        assert needle in result.stdout


def test_backends_json_keeps_its_fields_and_adds_usable_here() -> None:
    result = runner.invoke(app, ["backends", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"backends", "quarantined"} <= set(data)
    ref = next(b for b in data["backends"] if b["entry_point"] == "reference")
    assert {"entry_point", "name", "version", "core_api", "providers"} <= set(ref)
    for p in ref["providers"]:
        assert {"op", "name", "impl", "device_types", "dtypes", "priority"} <= set(p)  # the spec's fields
        assert isinstance(p["usable_here"], bool) and isinstance(p["usable_on"], list)
        assert p["usable_here"] == bool(p["usable_on"]) and (p["why_not"] == "") == p["usable_here"]
    assert next(p for p in ref["providers"] if p["name"] == "reference")["usable_here"]


def test_backends_table_has_the_usable_here_column() -> None:
    result = runner.invoke(app, ["backends"])
    assert result.exit_code == 0
    assert "usable here" in result.stdout and "yes (cpu)" in result.stdout


def test_env_lists_every_magi2_variable_and_names_the_invalid_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    from magi2_core import config

    monkeypatch.setattr(config, "_values", {})  # as in a fresh process: nothing read yet
    for name in [n for n in os.environ if n.startswith("MAGI2_")]:  # the test suite's own (nox sets one)
        monkeypatch.delenv(name)
    env = {"MAGI2_ATTENTION_PROVIDER": "flash", "MAGI2_STRICT": "1", "MAGI2_RMSNORM_PROVIDER": "reference"}
    result = runner.invoke(app, ["env"], env=env)
    assert result.exit_code == 0, result.output
    assert "MAGI2_ATTENTION_PROVIDER=flash: INVALID: no provider of that name; valid: " in result.stdout
    assert "MAGI2_STRICT=1: ok" in result.stdout and "MAGI2_RMSNORM_PROVIDER=reference: ok" in result.stdout
    report = json.loads(runner.invoke(app, ["env", "--json"], env=env).stdout)
    bad = {o["variable"]: o for o in report["overrides"] if not o["valid"]}
    assert set(bad) == {"MAGI2_ATTENTION_PROVIDER"} and bad["MAGI2_ATTENTION_PROVIDER"]["value"] == "flash"
