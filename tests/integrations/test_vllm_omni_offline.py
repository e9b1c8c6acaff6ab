"""Offline, the vllm-omni tests say what they need: the wheel, and MAGI2_VLLM_OMNI_WHEEL to give it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ONE_TEST = f"{HERE / 'test_vllm_omni.py'}::test_register_is_idempotent_and_unregister_restores"


def _offline(**env: str) -> subprocess.CompletedProcess[str]:
    """That one test in a fresh pytest with no package index (as offline) and no wheel given."""
    base = {k: v for k, v in os.environ.items() if k not in ("MAGI2_VLLM_OMNI_WHEEL", "MAGI2_REQUIRE_VLLM_OMNI")}
    base |= {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", **env}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rsf", "-p", "no:cacheprovider", ONE_TEST],
        capture_output=True,
        text=True,
        timeout=600,
        env=base,
        cwd=HERE.parent.parent,
    )


@pytest.mark.parametrize("required", [False, True], ids=["skips", "fails-when-required"])
def test_offline_the_suite_names_the_wheel_and_the_variable_that_gives_it(required: bool) -> None:
    pytest.importorskip("triton")
    result = _offline(**({"MAGI2_REQUIRE_VLLM_OMNI": "1"} if required else {}))
    out = " ".join(result.stdout.split())
    assert ("1 error" if required else "1 skipped") in out, result.stdout[-3000:]  # a fixture fails as an error
    assert "need vllm-omni 0.30.0's wheel" in out and "needs the network" in out
    assert "set MAGI2_VLLM_OMNI_WHEEL=/path/to/vllm_omni-0.30.0-py3-none-any.whl" in out


def test_a_wheel_path_that_is_no_wheel_is_named() -> None:
    pytest.importorskip("triton")
    result = _offline(MAGI2_VLLM_OMNI_WHEEL="/nonexistent/vllm.whl")
    out = " ".join(result.stdout.split())
    assert "1 skipped" in out and "MAGI2_VLLM_OMNI_WHEEL=/nonexistent/vllm.whl must name" in out, out[-3000:]
