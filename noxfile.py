"""One session per backend, plus lint, typecheck, conformance, bench, gpu, report and dist.

``nox`` runs the CPU sessions (what CI runs); ``nox -s gpu`` and ``nox -s bench`` are for a machine
with an NVIDIA GPU. torch is pinned to the CPU build here.

Environments: every run builds them from scratch, but not one per session. ``lint`` has its own
(ruff alone); each ``tests-triton`` version has its own (the Triton under test is the point); every
other CPU session (typecheck, tests, the FA3/FA4/MATE fake-device tests, conformance) runs in one
shared environment with every backend and the test plugins installed, built once per run by the
``shared-env`` session they require (four environments of about 4.5 GB instead of nine of about
11 GB, and five fewer torch installs). Nothing those sessions test needs a backend to be absent; what
an absent numpy, Triton or backend must not break is pinned by tests that block the import
(tests/test_cli_startup.py), and conformance loads only the project's backends (``MAGI2_PLUGINS``).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"  # sessions with requires=
nox.options.sessions = [
    "lint",
    "typecheck",
    "tests",
    "tests-triton",
    "tests-cuda_fa3",
    "tests-cuda_fa4",
    "tests-musa_mate",
    "conformance",
]
nox.options.error_on_missing_interpreters = True

TORCH = "torch==2.13.0"  # the CPU build on this project's machines; a bare "torch" pulls a multi-GB CUDA build
TRITON = "triton==3.6.0"  # the H200 image's Triton; its interpreter runs the kernels on the CPU in CI
# Both ends of magi2-backend-triton's declared range (triton>=3.3,<3.10): tests-triton runs on each.
# (3.2.0's interpreter aborts the process in the MoE tests, so 3.2 is not claimed.)
TRITON_VERSIONS = ("3.3.1", "3.9.0")
INTERPRETER = (TRITON, "numpy")  # TRITON_INTERPRET=1 needs numpy, which triton does not declare
CORE = ("-e", "backends/reference", "-e", ".")
BACKENDS = ("-e", "backends/triton", "-e", "backends/cuda_fa3", "-e", "backends/cuda_fa4", "-e", "backends/musa_mate")
PLUGINS = ("-e", "tests/plugins/example", "-e", "tests/plugins/broken", "-e", "tests/plugins/impostor")
PYTEST = ("pytest", "-q", "-p", "no:cacheprovider")
SHARED = ["shared-env"]  # requires= of the sessions that run in the shared environment
PROJECT_BACKENDS = "triton,cuda_fa3,cuda_fa4,musa_mate"  # MAGI2_PLUGINS: the project's own (no test plugins)


def _install(session: nox.Session, *extra: str) -> None:
    session.install(TORCH, "pytest>=8")
    session.install(*CORE, *extra)


def _shared(session: nox.Session) -> Path:
    """The shared environment's bin directory (built by the ``shared-env`` session of this run)."""
    return session.cache_dir / "shared-env" / "bin"


def _run_shared(session: nox.Session, *args: str, env: dict[str, str] | None = None) -> None:
    """Run a command of the shared environment (its own path first, as an activated venv would)."""
    bin_dir = _shared(session)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    session.run(
        str(bin_dir / args[0]),
        *args[1:],
        env={"VIRTUAL_ENV": str(bin_dir.parent), "PATH": path, **(env or {})},
        external=True,
    )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff's rules of pyproject.toml, no line over 120 columns (E501) among them, and its formatter:
    ``ruff format .`` writes what ``--check`` asks for."""
    session.install("ruff==0.17.6")  # pinned: the formatter's output changes between versions
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(name="shared-env", venv_backend="none")
def shared_env(session: nox.Session) -> None:
    """Build the environment that typecheck, tests, the backends' fake-device tests and conformance share:
    the core, every backend, the test plugins, Triton 3.6 (its interpreter) and the test tools."""
    venv = _shared(session).parent
    session.run(sys.executable, "-m", "venv", "--clear", str(venv), external=True)
    pip = (str(venv / "bin" / "python"), "-m", "pip", "install", "-q")
    session.run(*pip, TORCH, "pytest>=8", external=True)
    session.run(*pip, *CORE, *BACKENDS, *PLUGINS, *INTERPRETER, "hypothesis>=6", "mypy>=1.10", "einops", external=True)


@nox.session(venv_backend="none", requires=SHARED)
def typecheck(session: nox.Session) -> None:
    """``mypy --strict`` over the core and every backend's package (pyproject.toml's ``[tool.mypy]``)."""
    _run_shared(session, "mypy")


@nox.session(venv_backend="none", requires=SHARED)
def tests(session: nox.Session) -> None:
    """Core + every backend, the example/broken third-party plugins, distributed (gloo), and the vllm-omni
    integration against vllm-omni 0.30.0's own modules: the tests download its wheel (no dependencies,
    ~8 MB) and may not skip here."""
    _run_shared(session, *PYTEST, "tests", *session.posargs, env={"MAGI2_REQUIRE_VLLM_OMNI": "1"})


@nox.session(name="tests-triton")
@nox.parametrize("triton", TRITON_VERSIONS)
def tests_triton(session: nox.Session, triton: str) -> None:
    """Triton kernels under TRITON_INTERPRET=1 on small shapes, on the oldest and newest Triton claimed."""
    _install(session, f"triton=={triton}", "numpy", "-e", "backends/triton")
    session.run(*PYTEST, "backends/triton/tests", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session(name="tests-cuda_fa3", venv_backend="none", requires=SHARED)
def tests_cuda_fa3(session: nox.Session) -> None:
    """FA3 adapter against fake FA3 modules (every ABI variant); GPU tests skip here."""
    _run_shared(session, *PYTEST, "backends/cuda_fa3/tests", *session.posargs)


@nox.session(name="tests-cuda_fa4", venv_backend="none", requires=SHARED)
def tests_cuda_fa4(session: nox.Session) -> None:
    """FA4 adapter against a fake flash_attn.cute (FA4's signature and sink arithmetic); GPU tests skip here.
    flash-attn-4 itself is not installed: its CuTe DSL is ~230 MB and needs CUDA."""
    _run_shared(session, *PYTEST, "backends/cuda_fa4/tests", *session.posargs)


@nox.session(name="tests-musa_mate", venv_backend="none", requires=SHARED)
def tests_musa_mate(session: nox.Session) -> None:
    """MATE adapter against fake mate/torchada modules (v0.1.0, v0.1.3, v0.2); MUSA tests skip here."""
    _run_shared(session, *PYTEST, "backends/musa_mate/tests", *session.posargs)


@nox.session(venv_backend="none", requires=SHARED)
def conformance(session: nox.Session) -> None:
    """The conformance kit against the project's providers that can run here (Triton via the interpreter)."""
    _run_shared(
        session,
        "magi2",
        "check",
        "--device",
        "cpu",
        *session.posargs,
        env={"TRITON_INTERPRET": "1", "MAGI2_PLUGINS": PROJECT_BACKENDS},
    )


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """On an NVIDIA machine, in an environment that already has a CUDA torch and the backends installed:
    the gpu-marked tests, then the conformance kit against every provider that runs on CUDA."""
    session.run(*PYTEST, "-m", "gpu", "tests", "backends", *session.posargs)
    session.run(
        *PYTEST,
        "-p",
        "magi2_core.testing.plugin",
        "--magi2-conformance",
        "--magi2-only",
        "--magi2-device",
        "cuda",
        "-rs",
    )


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """On an NVIDIA machine: every benchmark, results as JSON under benchmarks/results/."""
    results = "benchmarks/results"
    session.run("python", "-m", "benchmarks.moe", "--out", f"{results}/moe_h200.json", *session.posargs)
    session.run("python", "-m", "benchmarks.rmsnorm", "--json", f"{results}/rmsnorm_h200.json")
    session.run("python", "-m", "benchmarks.sink_correction", "--json", f"{results}/sink_correction_h200.json")
    session.run("python", "-m", "benchmarks.attention", "--out", f"{results}/attention_h200.json")
    session.run("python", "-m", "benchmarks.block", "--out", f"{results}/block_h200.json")


@nox.session
def report(session: nox.Session) -> None:
    """README's results table, docs/benchmarks.md and its plots from benchmarks/results/*.json."""
    session.install("matplotlib>=3.8")
    session.run("python", "-m", "benchmarks.report")


DISTRIBUTIONS = (
    ".",
    "backends/reference",
    "backends/triton",
    "backends/cuda_fa3",
    "backends/cuda_fa4",
    "backends/musa_mate",
)


@nox.session
def dist(session: nox.Session) -> None:
    """Release check: build every distribution (wheel + sdist) into dist/, ``twine check`` them, then
    install the wheels (not editable) into fresh venvs from the local wheelhouse, ``[cuda]`` and then
    ``[musa]`` (no vendor stack), and run ``magi2 --version``, ``magi2 backends`` and ``magi2 demo``.

    Third-party wheels (torch's CPU build, triton, fa3-fwd, torchada, pydantic...) are first fetched
    into .nox/wheelhouse with ``pip download`` (the one online step), so that the install itself runs
    with ``--no-index``: nothing but the wheelhouse can satisfy it, and a missing or unbuildable
    dependency fails here, not on a user's machine.
    """
    start = time.monotonic()
    # No build isolation: every build-system.requires is just setuptools>=77, installed here once
    # (an isolated build creates two venvs per distribution and took 9.5 of this session's 10 minutes).
    session.install("build>=1.2", "twine>=5", "setuptools>=77")
    out = Path("dist")
    shutil.rmtree(out, ignore_errors=True)
    for project in DISTRIBUTIONS:
        session.run("python", "-m", "build", "--no-isolation", "--outdir", str(out), project)
    built = sorted(str(p) for p in out.iterdir())
    session.run("twine", "check", "--strict", *built)
    wheelhouse = Path(".nox/wheelhouse")
    requirements = [TORCH, "magi2-core[cuda]", "magi2-core[musa]"]
    session.run(
        "python", "-m", "pip", "download", "-q", "--dest", str(wheelhouse), "--find-links", str(out), *requirements
    )
    for ours in wheelhouse.glob("magi2_*"):  # pip download copies the project's wheels too: keep only dist/'s
        ours.unlink()
    for extra in ("cuda", "musa"):
        venv = Path(session.create_tmp()) / f"wheels-{extra}"
        session.run("python", "-m", "venv", "--clear", str(venv))
        bin_dir = venv / "bin"
        session.run(
            str(bin_dir / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(out),
            "--find-links",
            str(wheelhouse),
            f"magi2-core[{extra}]",
            external=True,
        )
        session.run(str(bin_dir / "python"), "-m", "pip", "check", external=True)
        session.run(str(bin_dir / "magi2"), "--version", external=True)
        session.run(str(bin_dir / "magi2"), "backends", external=True)
        session.run(str(bin_dir / "magi2"), "demo", "--device", "cpu", external=True)
    session.log(
        f"dist: {len(built)} files built and installed as [cuda] and [musa] in {time.monotonic() - start:.0f} s"
    )
