"""The import structure: no cycle in the core, layers in one direction, backends import only ``magi2_core.backend``.

Every ``import`` statement is read from the source (``ast``): at module level, under ``TYPE_CHECKING``
and inside functions alike, so a lazy import cannot hide a cycle. An import of ``a.b`` counts as an
edge to ``a.b`` only; ``from a import b`` to the submodule ``a.b`` when there is one, else to ``a``.

A core module may import only modules of its own layer or of a lower one (:data:`LAYERS`); an import
inside a function is allowed only where :data:`LAZY_ALLOWED` gives the reason (startup time, an
optional dependency), never to break a cycle.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORE = "magi2_core"

# The layers of the core, lowest first. A module's layer is that of the longest entry naming it or a
# package above it ("pkg.*": the package and everything in it). A new module must be placed here.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "the data model, errors and configuration",
        (
            "magi2_core._version",
            "magi2_core.errors",
            "magi2_core.config",
            "magi2_core.reasons",
            "magi2_core.resolution",
            "magi2_core.hookspecs",
            "magi2_core.model.*",
            "magi2_core.profiles.*",
        ),
    ),
    (
        "contracts: math and checks",
        ("magi2_core.contracts.*", "magi2_core.sink_correction", "magi2_core.sink_correction.reference"),
    ),
    ("op specs", ("magi2_core.ops._spec", "magi2_core.ops._args")),
    ("selection: registry, resolver, dispatch", ("magi2_core.selection.*", "magi2_core.sink_correction.choice")),
    (
        "operators and the public API",
        (
            "magi2_core",
            "magi2_core._api",
            "magi2_core.backend",
            "magi2_core.ops.*",
            "magi2_core.nn",
            "magi2_core.distributed.*",
            "magi2_core.integrations.*",
        ),
    ),
    ("tools: the demo, the environment report, overhead and timing", ("magi2_core.tools.*",)),
    ("the conformance kit", ("magi2_core.testing.*",)),
    ("magi2 tune: measuring a device, writing its profile", ("magi2_core.tuning.*",)),
    ("the command line", ("magi2_core.cli.*",)),
)

# Imports inside a function, (importing module or package.*, imported module) -> why. Startup time and
# optional dependencies only: an import that would close a cycle is a layering error, not an entry here.
LAZY_ALLOWED: dict[tuple[str, str], str] = {
    ("magi2_core", "magi2_core._api"): "PEP 562: `import magi2_core` stays free of torch and pydantic until a "
    "public name is used (`magi2 --help`, the auto-loaded pytest plugin)",
    ("magi2_core.config", "magi2_core.profiles.model"): "pydantic's profile models load only when MAGI2_PROFILE "
    "names a file",
    ("magi2_core.profiles.active", "magi2_core.model.devices"): "torch loads only when a device's profile is selected",
    ("magi2_core.testing.plugin", "magi2_core.testing.op_cases"): "the pytest plugin is loaded by every pytest "
    "run; the kit only by runs that use it",
    ("magi2_core.testing.plugin", "magi2_core.testing.runner"): "the pytest plugin is loaded by every pytest run; "
    "the kit only by runs that use it",
    ("magi2_core.cli.*", "*"): "a command's modules load when it runs, so that `magi2 --help` stays fast",
}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (of the walked package)
    line: int
    lazy: bool  # inside a function or class body, not at module level


def _modules(src: Path, package: str) -> dict[str, Path]:
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _module_level(tree: ast.Module) -> set[int]:
    """Ids of the import nodes that run when the module is imported (also under ``if``/``try``)."""
    out: set[int] = set()
    for node in tree.body:
        if isinstance(node, (ast.If, ast.Try, ast.Import, ast.ImportFrom)):
            out |= {id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def imports(src: Path, package: str) -> tuple[dict[str, Path], list[Import]]:
    """Every module of ``package`` under ``src`` and every import among them (or from ``magi2_core``)."""
    modules = _modules(src, package)
    out = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        top = _module_level(tree)
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here[: len(here) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules or _is_core_module(f"{base}.{a.name}") else base
                    for a in node.names
                ]
            for target in targets:
                if target.split(".")[0] in (package, CORE) and target != name:
                    out.append(Import(name, target, node.lineno, id(node) not in top))
    return modules, out


_CORE_MODULES = _modules(ROOT, CORE)


def _is_core_module(name: str) -> bool:
    return name in _CORE_MODULES


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (length of the matching entry, layer)
    for i, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            pkg = entry.removesuffix(".*")
            if module == pkg or (entry.endswith(".*") and module.startswith(pkg + ".")):
                if best is None or len(pkg) > best[0]:
                    best = (len(pkg), i)
    if best is None:
        raise KeyError(f"{module} is in no layer of tests/test_layers.py LAYERS; place it there")
    return best[1]


def cycles(edges: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _describe(component: list[str], edges: list[Import]) -> str:
    inside = set(component)
    return ", ".join(f"{e.source}:{e.line} -> {e.target}" for e in edges if e.source in inside and e.target in inside)


MODULES, EDGES = imports(ROOT, CORE)


def test_the_walk_sees_every_kind_of_import() -> None:
    """The walk itself: module level, TYPE_CHECKING and function-level imports, relative ones resolved."""
    seen = {(e.source, e.target, e.lazy) for e in EDGES}
    assert ("magi2_core.ops._lookup", "magi2_core.selection.dispatch", False) in seen  # module level
    assert ("magi2_core.selection.dispatch", "magi2_core.ops._spec", False) in seen  # under TYPE_CHECKING
    assert ("magi2_core.config", "magi2_core.profiles.model", True) in seen  # inside a function
    assert cycles([Import("a", "b", 1, False), Import("b", "c", 2, True), Import("c", "a", 3, False)]) == [
        ["a", "b", "c"]
    ]


def test_the_core_has_no_import_cycle() -> None:
    found = cycles(EDGES)
    assert not found, "import cycles in magi2_core: " + " | ".join(_describe(c, EDGES) for c in found)


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)  # raises naming the module


def test_layers_import_only_downwards() -> None:
    wrong = [
        f"{e.source}:{e.line} ({LAYERS[layer_of(e.source)][0]}) imports {e.target} ({LAYERS[layer_of(e.target)][0]})"
        for e in EDGES
        if layer_of(e.target) > layer_of(e.source)
    ]
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def _lazy_reason(e: Import) -> tuple[str, str] | None:
    for (source, target), _ in LAZY_ALLOWED.items():
        pkg = source.removesuffix(".*")
        if (e.source == source or (source.endswith(".*") and e.source.startswith(pkg + "."))) and target in (
            e.target,
            "*",
        ):
            return source, target
    return None


def test_lazy_imports_have_a_listed_reason() -> None:
    lazy = [e for e in EDGES if e.lazy]
    unlisted = [f"{e.source}:{e.line} -> {e.target}" for e in lazy if _lazy_reason(e) is None]
    assert not unlisted, (
        "imports inside functions without a reason in LAZY_ALLOWED (move them to module level; "
        "if that makes a cycle, the layering is wrong):\n" + "\n".join(unlisted)
    )
    used = {_lazy_reason(e) for e in lazy}
    assert not set(LAZY_ALLOWED) - used, f"LAZY_ALLOWED entries nothing uses: {sorted(set(LAZY_ALLOWED) - used)}"


def test_production_modules_never_import_the_test_kit() -> None:
    kit = layer_of("magi2_core.testing")
    wrong = [
        f"{e.source}:{e.line} -> {e.target}"
        for e in EDGES
        if e.target.startswith("magi2_core.testing") and layer_of(e.source) < kit
    ]
    assert not wrong


# -- the shipped backends --------------------------------------------------------------------
BACKEND_SRC = sorted((ROOT / "backends").glob("*/src"))


def _backend_package(src: Path) -> str:
    (package,) = [p.name for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    return package


@pytest.mark.parametrize("src", BACKEND_SRC, ids=lambda s: s.parent.name)
def test_a_backend_imports_only_magi2_core_backend(src: Path) -> None:
    _, edges = imports(src, _backend_package(src))
    wrong = sorted(
        {
            f"{e.source}:{e.line} imports {e.target}"
            for e in edges
            if e.target.split(".")[0] == CORE and e.target != "magi2_core.backend"
        }
    )
    assert not wrong, (
        "a backend may import only magi2_core.backend from the core (docs/api.md, "
        "'For backend authors'):\n" + "\n".join(wrong)
    )


@pytest.mark.parametrize("src", BACKEND_SRC, ids=lambda s: s.parent.name)
def test_a_backend_has_no_import_cycle(src: Path) -> None:
    package = _backend_package(src)
    _, edges = imports(src, package)
    own = [e for e in edges if e.target.split(".")[0] == package]
    found = cycles(own)
    assert not found, "import cycles: " + " | ".join(_describe(c, own) for c in found)


def test_there_are_backends_to_check() -> None:
    assert {s.parent.name for s in BACKEND_SRC} >= {"reference", "triton", "cuda_fa3", "cuda_fa4", "musa_mate"}


# -- the backend facade ----------------------------------------------------------------------
def test_the_backend_facade_table_and_its_type_checking_block_agree() -> None:
    import magi2_core.backend as facade

    tree = ast.parse(Path(facade.__file__).read_text(encoding="utf-8"))
    typed: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for imp in ast.walk(node):
                if isinstance(imp, ast.ImportFrom):
                    typed |= {a.asname or a.name: f"{imp.module}:{a.name}" for a in imp.names}
    home = {name: f"{module}:{attr}" for name, (module, attr) in facade._HOME.items()}
    assert typed == home
    assert sorted(facade.__all__) == sorted(home)


def test_every_backend_facade_name_is_its_home_object() -> None:
    import importlib

    import magi2_core.backend as facade

    for name, (module, attr) in facade._HOME.items():
        assert getattr(facade, name) is getattr(importlib.import_module(module), attr), name
    with pytest.raises(AttributeError, match=r"magi2_core\.backend has no name 'get_registry'"):
        facade.get_registry  # noqa: B018


def test_the_process_registry_hands_its_profile_fragments_to_the_profiles() -> None:
    """Profiles sit below the registry: they get the backends' fragments by injection, not by import."""
    from magi2_core.profiles import active
    from magi2_core.selection.registry import get_registry

    source = active._backend_fragments
    assert source is not None and tuple(source()) == get_registry().state().profiles


def test_the_documented_old_name_of_reasons_still_imports() -> None:
    """docs/api.md once named magi2_core.resolution: it stays an alias of magi2_core.reasons (CHANGELOG)."""
    import magi2_core.reasons as reasons
    import magi2_core.resolution as old

    assert old.__all__ == reasons.__all__
    assert all(getattr(old, name) is getattr(reasons, name) for name in reasons.__all__)


def test_the_documented_old_name_of_backend_spec_still_imports() -> None:
    """docs/api.md named magi2_core.hookspecs.hookimpl: the module stays an alias of magi2_core.model.backend_spec."""
    import magi2_core.hookspecs as old
    import magi2_core.model.backend_spec as spec

    assert old.__all__ == spec.__all__
    assert all(getattr(old, name) is getattr(spec, name) for name in spec.__all__)
