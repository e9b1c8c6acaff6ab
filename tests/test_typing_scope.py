"""What mypy checks: the core and every backend, strictly; unannotated functions only where they are kernels.

pyproject.toml's mypy configuration lets the modules that define Triton/Gluon kernels keep kernels
unannotated (their parameters are values of the kernel language). These tests keep that exemption as
narrow as its reason: every function left unannotated is a kernel, the exempted modules are exactly
those that define kernels, and every backend package of the repository is checked.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parent.parent
BACKEND_SOURCES = sorted(p.parent for p in ROOT.glob("backends/*/src/*/__init__.py"))
EXEMPT_CODES = {"no-untyped-def", "untyped-decorator"}


def _mypy() -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    return config


def _exempt_modules() -> set[str]:
    return {
        m
        for o in _mypy().get("overrides", [])
        if EXEMPT_CODES & set(o.get("disable_error_code", []))
        for m in o["module"]
    }


def _is_kernel(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated by ``<something>.jit`` or ``<something>.jit(...)`` (``triton.jit``, ``gluon.jit``)."""
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if isinstance(target, ast.Attribute) and target.attr == "jit":
            return True
    return False


def _unannotated(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
    if args and args[0].arg in ("self", "cls"):
        args = args[1:]
    args += [a for a in (fn.args.vararg, fn.args.kwarg) if a is not None]
    return fn.returns is None or any(a.annotation is None for a in args)


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def _module(path: Path) -> str:
    """``backends/<name>/src/<package>/a/b.py`` -> ``<package>.a.b``."""
    parts = path.relative_to(ROOT).with_suffix("").parts[3:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> list[Path]:
    return [p for src in BACKEND_SOURCES for p in sorted(src.rglob("*.py"))]


def test_every_backend_package_is_type_checked() -> None:
    config = _mypy()
    assert BACKEND_SOURCES
    for src in BACKEND_SOURCES:
        assert src.name in config["packages"], f"add {src.name} to [tool.mypy] packages in pyproject.toml"
        assert str(src.parent.relative_to(ROOT)) in config["mypy_path"], (
            f"add {src.parent.relative_to(ROOT)} to [tool.mypy] mypy_path in pyproject.toml"
        )


def test_only_kernels_are_unannotated() -> None:
    loose = [
        f"{p.relative_to(ROOT)}:{fn.lineno} {fn.name}"
        for p in _sources()
        for fn in _functions(p)
        if _unannotated(fn) and not _is_kernel(fn)
    ]
    assert not loose, f"annotate these functions (only @*.jit kernels may stay unannotated): {loose}"


def test_the_exemption_names_exactly_the_kernel_modules() -> None:
    with_kernels = {_module(p) for p in _sources() if any(_is_kernel(fn) for fn in _functions(p))}
    assert with_kernels, "no kernel found: the search for @*.jit is broken"
    assert _exempt_modules() == with_kernels, (
        "the mypy override that disables no-untyped-def/untyped-decorator must list exactly the modules "
        f"that define kernels; missing {sorted(with_kernels - _exempt_modules())}, "
        f"not needed {sorted(_exempt_modules() - with_kernels)}"
    )
