"""Impossible requests end in one line on stderr and exit code 2 (no traceback, no fake success)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from magi2_core.cli import app

runner = CliRunner()


def _rejected(args: list[str], needle: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"magi2 {args[0]}: error: "), result.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["explain", "attention", "--device", "nope"], "unknown device type 'nope'"),
        (["explain", "attention", "--heads-q", "24", "--heads-kv", "7"], "not a multiple of --heads-kv 7"),
        (["explain", "moe_route", "--experts", "8", "--top-k", "9"], "--top-k 9 exceeds --experts 8"),
        (["explain", "moe_experts", "--experts", "4", "--top-k", "6"], "--top-k 6 exceeds --experts 4"),
        (["explain", "attention", "--tokens", "10", "--max-seqlen-q", "20"], "exceeds --tokens 10"),
        (
            ["explain", "attention", "--tokens", "100", "--segments", "2", "--max-seqlen-q", "10"],
            "--tokens 100 do not fit in --segments 2 of at most --max-seqlen-q 10",
        ),
        (
            ["explain", "rmsnorm", "--out-dtype", "int8"],
            "--out-dtype int8: rmsnorm writes bfloat16, float16 or float32",
        ),
        (["explain", "attention", "--dtype", "int8"], "--dtype int8: the ops take bfloat16, float16, float32"),
        (["explain", "rmsnorm", "--width", "0"], "--width must be at least 1"),
        (["explain", "attention", "--head-dim", "-8"], "--head-dim must be at least 1"),
        (["explain", "convolution"], "unknown op 'convolution'"),
        (["explain", "attention", "--provider", "nope"], "no provider named 'nope'"),
        (["overhead", "--iters", "0"], "--iters must be at least 1; got 0"),
        (["overhead", "--iters", "-5"], "--iters must be at least 1; got -5"),
        (["overhead", "--device", "gpu"], "--device must be one of cpu, cuda; got 'gpu'"),
        (["check", "--op", "nope"], "unknown --op nope"),
        (["check", "--device", "nope"], "--device nope: no usable device"),
        (["check", "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["check", "--provider", "nope"], "no installed provider named ['nope']"),
        (["demo", "--device", "nope"], "no usable nope device here"),
        (["demo", "--device", "cpu:x"], "is not a torch device"),
    ],
)
def test_impossible_requests_are_one_line_errors(args: list[str], needle: str) -> None:
    _rejected(args, needle)


@pytest.mark.parametrize("device", ["cuda", "musa"], ids=["nvidia", "moore-threads"])
def test_demo_on_a_missing_runtime_is_a_one_line_error(device: str) -> None:
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    if device == "musa" and getattr(torch, "musa", None) is not None and torch.musa.is_available():
        pytest.skip("a MUSA device is present")
    _rejected(["demo", "--device", device], f"no usable {device} device here")


def test_bench_is_the_earlier_name_of_overhead() -> None:
    result = runner.invoke(app, ["bench", "--iters", "0"])
    assert result.exit_code == 2 and "magi2 overhead: error: --iters must be at least 1" in result.stderr


def test_overhead_on_inputs_of_a_missing_cuda_is_a_one_line_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    _rejected(["overhead", "--device", "cuda"], "--device cuda needs a CUDA device")


def test_check_on_an_absent_device_type_is_rejected_not_ok_with_zero_cases() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    result = runner.invoke(app, ["check", "--device", "cuda", "--json"])
    assert result.exit_code == 2
    assert "no usable device" in json.loads(result.stdout)["error"]


@pytest.mark.parametrize(
    "args",
    [
        ["explain", "attention", "--provider", "nope", "--json"],
        ["check", "--device", "nope", "--json"],
        ["overhead", "--iters", "-5", "--json"],
        ["explain", "attention", "--device", "nope", "--json"],
    ],
)
def test_json_mode_errors_are_json(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    data = json.loads(result.stdout)
    assert data["command"] == args[0] and data["error"]


def test_check_with_nothing_runnable_here_is_rejected() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    # torch_varlen ships with the reference backend (always installed) and runs on CUDA only
    _rejected(["check", "--provider", "torch_varlen"], "nothing to check here: attention[torch_varlen]")


def test_explain_accepts_a_device_type_that_only_a_plugin_declares() -> None:
    from magi2_core.selection.registry import get_registry

    declared = (p.capability.device_types for op in get_registry().state().providers.values() for p in op)
    if not any("fpga" in device_types for device_types in declared):
        pytest.skip("the example plugin (tests/plugins/example, device 'fpga') is not installed")
    result = runner.invoke(app, ["explain", "rmsnorm", "--device", "fpga", "--dtype", "float32"])
    assert result.exit_code == 0, result.output  # the example plugin's made-up device is known to the registry


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (
            ["demo", "--json"],
            {"MAGI2_ATTENTION_PROVIDER": "nope"},
            "UnknownProviderError: attention: no provider named 'nope' (env override MAGI2_ATTENTION_PROVIDER); "
            "installed: [",
        ),
        (["demo", "--json"], {"MAGI2_MOE_PROVIDER": "not_installed"}, "no provider named 'not_installed'"),
        (["demo"], {"MAGI2_SHADOW": "2"}, "ConfigError: MAGI2_SHADOW='2' is not valid (outside [0, 1]); accepted"),
        (["demo"], {"MAGI2_PLUGINS": "nope"}, "MAGI2_PLUGINS='nope' is not valid (not installed: ['nope']"),
        (["demo"], {"MAGI2_CHECK_DEVICE_VALUES": "maybe"}, "MAGI2_CHECK_DEVICE_VALUES='maybe' is not valid"),
        (["demo"], {"MAGI2_STRICT": "banana"}, "MAGI2_STRICT='banana' is not valid (not a boolean); accepted: 1"),
        (["backends"], {"MAGI2_SHADOW": "abc"}, "MAGI2_SHADOW='abc' is not valid"),
        (["env"], {"MAGI2_SHADOW_RAISE": "perhaps"}, "MAGI2_SHADOW_RAISE='perhaps'"),
        (["explain", "rmsnorm"], {"MAGI2_DETERMINISTIC": "y"}, "MAGI2_DETERMINISTIC='y'"),
        # variables a backend declares (magi2-backend-musa-mate's), read when the backends load
        (["check", "--op", "rmsnorm"], {"MAGI2_MATE_BACKEND": "fast"}, "MAGI2_MATE_BACKEND='fast'"),
        (["overhead", "--iters", "1"], {"MAGI2_MATE_SINK_CORRECTION": "numpy"}, "MAGI2_MATE_SINK_CORRECTION='numpy'"),
        (["explain", "rmsnorm"], {"MAGI2_RMSNORM_PROVIDER": "nope"}, "no provider named 'nope'"),
    ],
)
def test_a_bad_magi2_variable_is_a_one_line_error_in_every_command(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], needle: str
) -> None:
    """What was wrong and what works, in one line, exit 2: no traceback, no table, no backend reported
    quarantined for it (``MAGI2_SHADOW=abc magi2 backends`` once listed the reference as quarantined)."""
    from magi2_core import config

    monkeypatch.setattr(config, "_values", {})  # as in a fresh process: nothing read yet
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output and "quarantined" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(f"magi2 {args[0]}: error: ") and needle in lines[-1], result.stderr
    assert all(line.startswith("  done ") for line in lines[:-1]), lines  # only the demo's progress before it


def test_a_forced_provider_that_cannot_serve_the_demo_says_why_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from magi2_core import config

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: fa3 may serve the demo")
    monkeypatch.setattr(config, "_values", {})
    result = runner.invoke(app, ["demo", "--json"], env={"MAGI2_ATTENTION_PROVIDER": "fa3"})
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("magi2 demo: error: ProviderNotEligibleError: attention: provider 'fa3' was forced")
    assert "[device_type] device_type: needs cuda, got cpu" in line and "magi2 explain" in line
