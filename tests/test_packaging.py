"""Packaging metadata: licence, typing marker, and each backend's declared core range (metadata and load time)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import magi2_core

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = {
    "reference": "magi2_backend_reference",
    "triton": "magi2_backend_triton",
    "cuda_fa3": "magi2_backend_cuda_fa3",
    "cuda_fa4": "magi2_backend_cuda_fa4",
    "musa_mate": "magi2_backend_musa_mate",
}


def _project(path: Path) -> dict[str, object]:
    return tomllib.loads((path / "pyproject.toml").read_text())["project"]  # type: ignore[no-any-return]


def _requirements(project: dict[str, object]) -> list[Requirement]:
    deps = [Requirement(r) for r in project.get("dependencies", [])]  # type: ignore[attr-defined]
    for extra in project.get("optional-dependencies", {}).values():  # type: ignore[attr-defined]
        deps += [Requirement(r) for r in extra]
    return deps


@pytest.mark.parametrize("where", [".", *(f"backends/{b}" for b in BACKENDS)])
def test_every_distribution_declares_the_licence_and_ships_it(where: str) -> None:
    project = _project(ROOT / where)
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (ROOT / where / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert "Typing :: Typed" in project["classifiers"]  # type: ignore[operator]
    assert project.get("urls"), "project URLs"


@pytest.mark.parametrize("package", ["magi2_core", *(f"backends/{b}/src/{p}" for b, p in BACKENDS.items())])
def test_every_package_has_py_typed_and_declares_it_as_package_data(package: str) -> None:
    assert (ROOT / package / "py.typed").is_file()
    where = ROOT if package == "magi2_core" else ROOT / package.split("/src/")[0]
    package_data = tomllib.loads((where / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    declared = package_data[package.rsplit("/", 1)[-1]]
    assert "py.typed" in declared
    # every data file of the package (a backend's profile fragments) is declared, or a wheel would lack it
    data = [
        p.relative_to(ROOT / package)
        for p in (ROOT / package).rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts
    ]
    missing = [str(p) for p in data if not any(p.match(glob) for glob in declared)]
    assert not missing, f"{package}: data files not in package-data: {missing}"
    if package == "magi2_core":
        assert "profiles/*.json" in declared


def _declared_core_api(backend: str) -> str:
    """``core_api=...`` in the backend's plugin module, read from its source (the backend may not be
    installed in this session's environment)."""
    source = ROOT / "backends" / backend / "src" / BACKENDS[backend] / "plugin.py"
    found = [
        kw.value.value
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Call)
        for kw in node.keywords
        if kw.arg == "core_api" and isinstance(kw.value, ast.Constant)
    ]
    assert len(found) == 1, f"{source}: one literal core_api expected, found {found}"
    return str(found[0])


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_backend_core_range_in_metadata_and_at_load_time_admit_this_core(backend: str) -> None:
    project = _project(ROOT / "backends" / backend)
    core = [r for r in _requirements(project) if r.name == "magi2-core"]
    assert len(core) == 1, f"{backend} must name the magi2-core range once in its metadata"
    assert Version(magi2_core.__version__) in core[0].specifier
    hard = [Requirement(r).name for r in project.get("dependencies", [])]  # type: ignore[attr-defined]
    if backend == "reference":  # the core depends on it: the range is the [core] extra, never a dependency
        assert "magi2-core" not in hard
        assert any(Requirement(r).name == "magi2-core" for r in project["optional-dependencies"]["core"])  # type: ignore[index]
    else:
        assert "magi2-core" in hard
    assert Version(magi2_core.CORE_API_VERSION) in SpecifierSet(_declared_core_api(backend))


def test_core_pins_the_backends_at_their_versions() -> None:
    pins = {r.name: r.specifier for r in _requirements(_project(ROOT)) if r.name.startswith("magi2-backend-")}
    for backend in BACKENDS:
        project = _project(ROOT / "backends" / backend)
        assert str(pins[str(project["name"])]) == f"=={project['version']}"


def test_triton_bound_is_the_range_the_nox_sessions_run() -> None:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    tested = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TRITON_VERSIONS" for t in node.targets)
    )
    triton = next(r for r in _requirements(_project(ROOT / "backends" / "triton")) if r.name == "triton")
    oldest, newest = min(tested, key=Version), max(tested, key=Version)
    assert triton.specifier == SpecifierSet(f">={'.'.join(oldest.split('.')[:2])},<3.{Version(newest).minor + 1}")


def test_the_core_depends_on_numpy_so_importing_torch_prints_no_numpy_warning() -> None:
    """torch warns "Failed to initialize NumPy" at import without numpy and does not declare it."""
    names = {r.name for r in _requirements(_project(ROOT)) if r.marker is None}
    assert "numpy" in names


def test_importing_the_library_and_calling_an_op_prints_no_warning() -> None:
    import subprocess
    import sys

    code = "import torch, magi2_core as m2; m2.rmsnorm(torch.randn(4, 8), torch.zeros(1, 1, 8)); print('ok')"
    result = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
    assert "NumPy" not in result.stderr, result.stderr[-2000:]
