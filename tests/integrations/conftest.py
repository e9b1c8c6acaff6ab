"""vllm-omni 0.30.0's released wheel, for the integration tests: downloaded once per session.

``vllm_omni_root`` is the unpacked wheel. ``MAGI2_VLLM_OMNI_WHEEL`` names a wheel or an unpacked
directory to use instead of downloading; otherwise ``pip download --no-deps vllm-omni==0.30.0``
fetches it into pytest's cache (or a session temp directory when the cache is off). When neither
works the tests that need it skip with the reason; with ``MAGI2_REQUIRE_VLLM_OMNI=1`` (set by the
nox ``tests`` session, so CI cannot pass by skipping) they fail instead.

``vllm_omni`` imports from it with vLLM stubbed (``benchmarks/_vllm_stubs.py`` lists every stub)
and undoes everything after the test: the modules, the plugin's import hook and patches, the
configuration.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import magi2_core as m2
from benchmarks import _vllm_stubs as stubs
from magi2_core.integrations import vllm_omni as integ

WHEEL_ENV = "MAGI2_VLLM_OMNI_WHEEL"
REQUIRE_ENV = "MAGI2_REQUIRE_VLLM_OMNI"


def _cache_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider (as in nox)
    return cache.mkdir("vllm-omni-wheel") if cache is not None else tmp_path_factory.mktemp("vllm-omni-wheel")


def _say(request: pytest.FixtureRequest, line: str) -> None:
    """One line on the terminal now, past pytest's output capture."""
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is None:
        return
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        reporter.write_line(line)


def unavailable(exc: Exception, given: str | None) -> str:
    """Why the vllm-omni tests cannot run, and what makes them run (offline: a wheel fetched elsewhere)."""
    reason = f"the vllm-omni integration tests need vllm-omni {stubs.VERSION}'s wheel and cannot get it: {exc}"
    if isinstance(exc, RuntimeError) and "Triton" in str(exc):
        return reason
    fetch = f"pip download --no-deps vllm-omni=={stubs.VERSION}"
    if given:
        return f"{reason}; {WHEEL_ENV}={given} must name {stubs.WHEEL} or its unpacked directory"
    return (
        f"{reason}; they download it with `{fetch}` (about 8 MB), which needs the network: offline, fetch "
        f"it elsewhere and set {WHEEL_ENV}=/path/to/{stubs.WHEEL}"
    )


@pytest.fixture(scope="session")
def vllm_omni_root(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The unpacked vllm-omni wheel (downloaded at most once per session)."""
    cache = _cache_dir(request, tmp_path_factory)
    given = os.environ.get(WHEEL_ENV)
    try:
        if importlib.util.find_spec("triton") is None:
            raise RuntimeError("vllm-omni's MAGI-2 modules import Triton, which is not installed (pip install triton)")
        if given:
            source = Path(given)
            _say(request, f"vllm-omni {stubs.VERSION}: using {source} ({WHEEL_ENV})")
        else:
            _say(request, f"vllm-omni {stubs.VERSION}: pip download --no-deps into {cache} (about 8 MB) ...")
            source = stubs.download(cache)
        return stubs.unpack(source, cache)
    except (OSError, RuntimeError, ValueError) as exc:
        reason = unavailable(exc, given)
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{reason} ({REQUIRE_ENV}=1: these tests may not be skipped)", pytrace=False)
        pytest.skip(reason)


@pytest.fixture
def vllm_omni(vllm_omni_root: Path) -> Iterator[Path]:
    """vllm-omni importable (vLLM stubbed) for one test; yields the directory it is imported from."""
    stubs.install(vllm_omni_root)
    try:
        yield vllm_omni_root
    finally:
        integ.unregister()
        stubs.uninstall()
        m2.reload_config()
