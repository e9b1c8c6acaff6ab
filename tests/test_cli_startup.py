"""Start-up cost: ``magi2 -h``/``--version`` and the auto-loaded pytest plugin import no torch.

Measured on the project's two-core CI machine (load average about 8, so wall times are inflated):
``magi2 --help`` went from 5-14 s (every command imported torch) to 0.28 s of CPU (about 0.3 s of
``python -X importtime``, typer and click being most of it; rich's help renderer is off because it
imports markdown-it). The plugin: ``import magi2_core.testing.plugin`` went from 8.8 s of import time
(3.7 s CPU: torch, pydantic and the kit) to 0.03 s beyond pytest itself; a one-test unrelated run
(``pytest -p no:hypothesispytest``) took 1.71-1.76 s with the plugin and 1.49-1.80 s with
``-p no:magi2_core.testing.plugin``, the same within the machine's noise.

These tests assert what makes that true (torch is not imported), not a time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import magi2_core


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    code = textwrap.dedent(
        f"""
        import sys
        from magi2_core.cli import main
        sys.argv = ["magi2", *{list(args)!r}]
        try:
            main()
        except SystemExit as exc:
            code = exc.code or 0
        else:
            code = 0
        heavy = sorted(m for m in ("torch", "magi2_core.ops", "magi2_core.selection.registry") if m in sys.modules)
        print("HEAVY:" + ",".join(heavy))
        sys.exit(code)
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("-h",),
        ("--version",),
        ("demo", "-h"),
        ("env", "--help"),
        ("check", "-h"),
        ("explain", "-h"),
        ("backends", "-h"),
        ("overhead", "-h"),
        ("bench", "-h"),
    ],
)
def test_help_and_version_import_no_torch(args: tuple[str, ...]) -> None:
    result = _run_cli(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith("HEAVY:"), result.stdout[-300:]


def test_version_names_core_and_contract() -> None:
    result = _run_cli("--version")
    assert result.stdout.startswith(
        f"magi2-core {magi2_core.__version__} (core contract {magi2_core.CORE_API_VERSION})"
    )


def test_importing_the_package_is_cheap_and_the_api_loads_on_first_use() -> None:
    code = (
        "import sys, magi2_core as m2; assert 'torch' not in sys.modules, 'import magi2_core pulled torch'; "
        "f = m2.rmsnorm; assert 'torch' in sys.modules; from magi2_core import attention; "
        "assert sorted(n for n in m2.__all__ if n not in vars(m2)) == []; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        magi2_core.nope  # noqa: B018


def test_plugin_loaded_but_unused_imports_no_torch(tmp_path: Path) -> None:
    (tmp_path / "test_unrelated.py").write_text(
        "import sys\n\n\ndef test_unrelated():\n"
        "    assert 'torch' not in sys.modules, 'the magi2 plugin imported torch in an unrelated run'\n"
        "    assert 'magi2_core.testing.plugin' in sys.modules\n"
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:hypothesispytest",
            "-p",
            "magi2_core.testing.plugin",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:]


def test_commands_print_no_warning_a_user_cannot_act_on_and_describe_without_kernel_imports() -> None:
    """numpy is no dependency: torch's ``Failed to initialize NumPy`` warning is not shown. Describing the
    backends (what ``magi2 backends`` does) imports no kernel module: the reference once imported
    ``torch.nn.attention.varlen`` (and with it torch._dynamo) to describe its CUDA-only provider, which
    cost every command 2.6 s here and printed "backend 'reference' took 2.5 s to import". The ops on the
    CPU then run without numpy and without importing Triton, whatever else is installed (the test
    environment has both: this is what keeps a core-only install honest)."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["numpy"] = None  # as in an environment without numpy
        from magi2_core.cli import main
        sys.argv = ["magi2", "backends", "--json"]
        try:
            main()
        except SystemExit as exc:
            assert not exc.code, exc.code
        heavy = [m for m in ("torch._dynamo", "torch.nn.attention.varlen", "triton") if m in sys.modules]
        import torch
        import magi2_core as m2
        q, k, v = (torch.randn(6, 2, 8) for _ in range(3))
        cu = torch.tensor([0, 6], dtype=torch.int32)
        m2.attention(q, k, v, cu, cu, sinks=torch.randn(1, 2))
        x = torch.randn(5, 2, 8)
        probs, idx = m2.moe_route(x, torch.randn(2 * 4, 8), torch.randn(2 * 4), top_k=2)
        m2.moe_experts(x, probs, idx, torch.randn(8, 8, 16), torch.randn(8, 8, 16), torch.randn(8, 16, 8))
        m2.rmsnorm(torch.randn(5, 8), torch.randn(1, 1, 8))
        heavy += [m for m in ("triton",) if m in sys.modules and m not in heavy]
        print("HEAVY:" + ",".join(heavy), file=sys.stderr)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "HEAVY:\n" in result.stderr, result.stderr[-500:]
    assert "NumPy" not in result.stderr and " to import and describe " not in result.stderr, result.stderr[-2000:]


def test_the_reference_reads_varlen_attn_parameters_without_importing_it() -> None:
    """What the descriptor claims (GQA only where varlen_attn takes enable_gqa) is the signature itself."""
    import inspect

    from magi2_backend_reference.plugin import _varlen_parameters

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        assert _varlen_parameters() == frozenset()
        return
    assert _varlen_parameters() == frozenset(inspect.signature(varlen_attn).parameters)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ("explain", "atention"),
            "magi2 explain: error: Invalid value for 'op': unknown op 'atention'; choose one of "
            "attention, moe_route, moe_experts, rmsnorm",
        ),
        (("explain", "--bogus"), "magi2 explain: error: No such option: --bogus"),
        (("explain", "attention", "--bogus"), "magi2 explain: error: No such option: --bogus"),
        (("nope",), "magi2: error: No such command 'nope'"),
    ],
)
def test_an_unknown_op_or_option_is_refused_in_one_line_before_torch_loads(args: tuple[str, ...], needle: str) -> None:
    """A typo answers at once: click's parsing refuses it before any command imports torch."""
    result = _run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert result.stdout.rstrip().endswith("HEAVY:"), result.stdout[-300:]
    (line,) = result.stderr.splitlines()
    assert line.startswith(needle), line
