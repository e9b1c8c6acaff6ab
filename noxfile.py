"""One session per backend, plus lint, typecheck, conformance, bench and gpu.

``nox`` runs the CPU sessions (what CI runs); ``nox -s gpu`` and ``nox -s bench`` are for a machine
with an NVIDIA GPU. Every session installs from scratch; torch is pinned to the CPU build here.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "typecheck", "tests", "tests-triton", "tests-cuda_fa3", "tests-musa_mate",
                        "conformance"]
nox.options.error_on_missing_interpreters = True

TORCH = "torch==2.13.0"  # the CPU build on this project's machines; a bare "torch" pulls a multi-GB CUDA build
TRITON = "triton==3.6.0"  # the H200 image's Triton; its interpreter runs the kernels on the CPU in CI
INTERPRETER = (TRITON, "numpy")  # TRITON_INTERPRET=1 needs numpy, which triton does not declare
CORE = ("-e", "backends/reference", "-e", ".")
PLUGINS = ("-e", "tests/plugins/example", "-e", "tests/plugins/broken", "-e", "tests/plugins/impostor")
PYTEST = ("pytest", "-q", "-p", "no:cacheprovider")


def _install(session: nox.Session, *extra: str) -> None:
    session.install(TORCH, "pytest>=8")
    session.install(*CORE, *extra)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    _install(session, "mypy>=1.10")
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """Core + reference backend, the example/broken third-party plugins, distributed (gloo)."""
    _install(session, "hypothesis>=6", *PLUGINS)
    session.run(*PYTEST, "tests", *session.posargs)


@nox.session(name="tests-triton")
def tests_triton(session: nox.Session) -> None:
    """Triton kernels under TRITON_INTERPRET=1 on small shapes."""
    _install(session, *INTERPRETER, "-e", "backends/triton")
    session.run(*PYTEST, "backends/triton/tests", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session(name="tests-cuda_fa3")
def tests_cuda_fa3(session: nox.Session) -> None:
    """FA3 adapter against fake FA3 modules (every ABI variant); GPU tests skip here."""
    _install(session, *INTERPRETER, "-e", "backends/triton", "-e", "backends/cuda_fa3")
    session.run(*PYTEST, "backends/cuda_fa3/tests", *session.posargs)


@nox.session(name="tests-musa_mate")
def tests_musa_mate(session: nox.Session) -> None:
    """MATE adapter against fake mate/torchada modules (v0.1.0, v0.1.3, v0.2); MUSA tests skip here."""
    _install(session, "-e", "backends/musa_mate")
    session.run(*PYTEST, "backends/musa_mate/tests", *session.posargs)


@nox.session
def conformance(session: nox.Session) -> None:
    """The conformance kit against every installed provider that can run here (Triton via the interpreter)."""
    _install(session, *INTERPRETER, "-e", "backends/triton", "-e", "backends/cuda_fa3", "-e", "backends/musa_mate")
    session.run("magi2", "check", "--device", "cpu", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """On an NVIDIA machine, in an environment that already has a CUDA torch and the backends installed:
    the gpu-marked tests, then the conformance kit against every provider that runs on CUDA."""
    session.run(*PYTEST, "-m", "gpu", "tests", "backends", *session.posargs)
    session.run(*PYTEST, "-p", "magi2_core.testing.plugin", "--magi2-conformance", "--magi2-only",
                "--magi2-device", "cuda", "-rs")


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """On an NVIDIA machine: every benchmark, results as JSON under benchmarks/results/."""
    results = "benchmarks/results"
    session.run("python", "-m", "benchmarks.moe", "--out", f"{results}/moe_h200.json", *session.posargs)
    session.run("python", "-m", "benchmarks.rmsnorm", "--json", f"{results}/rmsnorm_h200.json")
    session.run("python", "-m", "benchmarks.sink_correction", "--json", f"{results}/sink_correction_h200.json")
    session.run("python", "-m", "benchmarks.attention", "--out", f"{results}/attention_h200.json")
