"""The documentation against the repository: links resolve, no machine's paths, every doc listed.

README.md, docs/*.md and the backends' READMEs are read by users on their own machines: a link must
reach a file of the repository, and a path must be one the user has (a path of the repository,
relative), never a directory of the machine where a measurement or a session ran.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, *sorted(ROOT.glob("backends/*/README.md"))]

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target) and ![alt](target)
# An absolute path: "/" then a name, at the start of a token (not inside a URL, k/v, 1/L or a relative path).
_ABSOLUTE = re.compile(r"(?:^|(?<=[\s`'\"(=,;\[]))(/[A-Za-z_.][\w.+-]*(?:/[\w.+-]*)*)")
# What a session of the project's own machines left behind, never something a user has or runs.
_MACHINE = re.compile(r"\$OUT\b|\$\{OUT\}|\blent\b|(?<![\w-])device calls?\b|\bpayload\b|nvidia-h200-x\d|\bcarry `")


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _broken_links(text: str, where: Path, root: Path = ROOT) -> list[str]:
    broken = []
    for target in _LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):  # a URL, mailto:, an anchor
            continue
        path = (where / target.split("#", 1)[0]).resolve()
        if not path.exists() or root not in path.parents:
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves_to_a_file_of_the_repository(page: Path) -> None:
    broken = _broken_links(page.read_text(encoding="utf-8"), page.parent)
    assert not broken, f"{_rel(page)}: links that do not resolve to a file of the repository: {broken}"


def test_the_link_check_catches_a_missing_file_and_a_file_outside_the_repository() -> None:
    text = (
        "[ok](api.md) [anchor](operators.md#32-routing) [gone](no-such.md) [up](../../README.md) "
        "[web](https://example.org/x.md) ![plot](img/nope.svg)"
    )
    assert _broken_links(text, ROOT / "docs") == ["no-such.md", "../../README.md", "img/nope.svg"]


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_absolute_or_machine_specific_path(page: Path) -> None:
    found = []
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        found += [f"line {n}: {m}" for m in _ABSOLUTE.findall(line)]
        found += [f"line {n}: {m.group(0)!r}" for m in _MACHINE.finditer(line)]
    assert not found, f"{_rel(page)} names paths or machinery a user does not have: {found}"


def test_the_contributors_layout_names_every_doc() -> None:
    text = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    layout = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    missing = [p.name for p in DOCS if p.name not in layout]
    assert not missing, f"docs/contributing.md's Layout section does not list {missing}"
    assert "img/" in layout  # docs/img holds the generated plots


def test_the_readme_is_short_and_fits_100_columns() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    wide = [f"line {n}: {len(line)}" for n, line in enumerate(lines, 1) if len(line) > 100]
    assert not wide, f"README.md lines over 100 columns: {wide}"


def test_the_readme_keeps_its_two_commands() -> None:
    """.ci/run runs the line after '# run the tests'; the demo's install and run follow its comment."""
    lines = README.read_text(encoding="utf-8").splitlines()
    tests = lines[lines.index("# run the tests (lint, types, every backend's CPU tests, the conformance kit)") + 1]
    assert tests.endswith(".venv/bin/nox") and "pip install -q nox" in tests
    demo = lines.index("# set up and run the demo (the exact CPU reference when no GPU is present)")
    assert "-e backends/reference -e ." in lines[demo + 1] and lines[demo + 2] == ".venv/bin/magi2 demo"


def test_the_readme_command_table_names_real_commands_and_options() -> None:
    """Every ``magi2 COMMAND --option`` of the README's table is one the CLI takes; every command that
    prints a table takes ``--wide`` (the line under the table says so)."""
    import typer.main

    from magi2_core.cli import app

    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    section = README.read_text(encoding="utf-8").split("## Command line", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `magi2 (\w+)([^`]*)` \|", section, flags=re.M)
    assert len(rows) >= 7, section
    for name, rest in rows:
        options = {o for p in commands[name].params for o in (*p.opts, *p.secondary_opts)}
        unknown = [o for o in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", rest) if o not in options]
        assert not unknown, f"README: magi2 {name} has no option {unknown}"
    assert "`--wide`" in section
    for name in ("backends", "env", "check", "demo", "overhead"):
        assert "--wide" in {o for p in commands[name].params for o in p.opts}, name


def test_the_changelog_is_split_into_versions_under_a_short_unreleased() -> None:
    """Unreleased on top and short; then one section per version, newest first, each naming its core
    contract and saying whether it was published (none has been: no invented release dates)."""
    from packaging.version import Version

    import magi2_core

    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.*)$", text, flags=re.M)
    assert headings[0] == "Unreleased", headings
    versions = [
        re.fullmatch(r"(\d+\.\d+\.\d+) \(core contract (\d+)\): (not published|\d{4}-\d\d-\d\d)", h)
        for h in headings[1:]
    ]
    assert versions and all(versions), headings
    numbers = [Version(m.group(1)) for m in versions if m]
    assert numbers == sorted(numbers, reverse=True) and Version(magi2_core.__version__) in numbers
    contract = int(magi2_core.CORE_API_VERSION.split(".")[0])
    assert versions[0] and int(versions[0].group(2)) == contract  # the newest section is the current contract
    unreleased = text.split("## Unreleased\n", 1)[1].split("\n## ", 1)[0]
    assert len(unreleased.splitlines()) <= 60, "CHANGELOG.md: file the Unreleased entries under a version"


def readme_python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_readme_examples_run_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """Every python block of the README, exactly as written, in one namespace, on the CPU."""
    blocks = readme_python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README.md has no python example"
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "chosen: reference" in out  # explain() on a CPU: the exact reference serves attention


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("python3 -m pip install --target /tmp/site .whl/*.whl", ["/tmp/site"]),
        ("--out $OUT/distributed_h200x2.json", ["$OUT"]),
        ("see /work/main/README.md", ["/work/main/README.md"]),
        ("the lent H200", ["lent"]),
        ("(carry `.whl`)", ["carry `"]),
        ("its payload travels in two device calls", ["payload", "device calls"]),
        (
            "k/v, 1/L, https://docs.python.org/3/, backends/reference/src, eager / graph, $TMPDIR/$USER, "
            "a plain single-device call",
            [],
        ),
    ],
)
def test_the_path_checks_catch_what_they_are_for(text: str, bad: list[str]) -> None:
    got = _ABSOLUTE.findall(text) + [m.group(0) for m in _MACHINE.finditer(text)]
    assert got == bad
