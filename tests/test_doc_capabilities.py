"""The docs' statements of what a provider declares, checked against the loaded descriptors.

What a shipped provider declares (its activation dtypes and optional features) is stated in capability
tables: a Markdown table with a ``provider`` column and a ``dtypes`` or ``features`` column (and an
``op`` column where the provider name alone is ambiguous). Every row must equal the descriptor, and a
table that covers an op lists every shipped provider of it. Prose that says what a named provider
declares is held to the descriptors too: a positive claim must be true, and a restrictive one ("only",
"neither ... nor", "not") must be a table, where it is checked whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from magi2_core.model.capability import Capability
from magi2_core.model.problem import Feature
from magi2_core.selection.registry import get_registry

ROOT = Path(__file__).resolve().parents[1]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
SHIPPED = frozenset(  # the distributions of backends/*: their project name, the first `name =` of the file
    m.group(1)
    for p in sorted((ROOT / "backends").glob("*/pyproject.toml"))
    if (m := re.search(r'^name\s*=\s*"([^"]+)"', p.read_text(), re.MULTILINE))
)
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"} | {n: n for n in ("bfloat16", "float16", "float32")}
FEATURES = frozenset(f.value for f in Feature)
RESTRICTIVE = re.compile(r"\b(only|not|neither|nor|no|never|without)\b", re.IGNORECASE)
NONE = frozenset({"", "-", "—", "none"})


def shipped_capabilities() -> list[tuple[str, Capability]]:
    """(distribution, descriptor) of every provider of the backends this repository ships."""
    return [
        (backend.distribution, cap.capability)
        for backend in get_registry().backends()
        if backend.distribution in SHIPPED
        for cap in (get_registry().provider(c.op, c.name) for c in backend.spec.providers)
        if cap is not None
    ]


@dataclass(frozen=True)
class Row:
    doc: str
    line: int
    cells: dict[str, str]


def _cell(text: str) -> str:
    return text.strip().strip("`").strip()


def _items(text: str) -> list[str]:
    return [i for i in (_cell(p).lower() for p in text.split(",")) if i not in NONE]


def capability_tables(text: str, doc: str) -> list[list[Row]]:
    """The Markdown tables of ``text`` whose header has ``provider`` and ``dtypes`` or ``features``."""
    tables: list[list[Row]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("|") or i + 1 >= len(lines) or not re.match(r"^\|[\s:|-]+\|$", lines[i + 1]):
            i += 1
            continue
        header = [_cell(c).lower() for c in lines[i].strip("|").split("|")]
        rows: list[Row] = []
        j = i + 2
        while j < len(lines) and lines[j].startswith("|"):
            cells = lines[j].strip().strip("|").split("|")
            rows.append(Row(doc, j + 1, dict(zip(header, cells, strict=False))))
            j += 1
        if "provider" in header and {"dtypes", "features"} & set(header):
            tables.append(rows)
        i = j
    return tables


def table_problems(rows: list[Row], caps: list[tuple[str, Capability]]) -> list[str]:
    """What the rows of one capability table get wrong against the descriptors."""
    problems: list[str] = []
    covered_ops: set[str] = set()
    listed: set[tuple[str, str]] = set()
    for row in rows:
        provider, op = _cell(row.cells["provider"]), _cell(row.cells.get("op", ""))
        where = f"{row.doc}:{row.line} ({op or '?'} / {provider})"
        found = [c for _, c in caps if c.name == provider and (not op or c.op == op)]
        if len(found) != 1:
            problems.append(
                f"{where}: {len(found)} shipped descriptors match (name the op where the provider is ambiguous)"
            )
            continue
        cap = found[0]
        covered_ops.add(cap.op)
        listed.add((cap.op, cap.name))
        if "dtypes" in row.cells:
            said = {DTYPES.get(d, d) for d in _items(row.cells["dtypes"])}
            if said != set(cap.dtypes):
                problems.append(f"{where}: dtypes {sorted(said)}, the descriptor declares {sorted(cap.dtypes)}")
        if "features" in row.cells:
            said = set(_items(row.cells["features"]))
            declared = {f.value for f in cap.features}
            if said != declared:
                problems.append(f"{where}: features {sorted(said)}, the descriptor declares {sorted(declared)}")
    for _, cap in caps:
        if cap.op in covered_ops and (cap.op, cap.name) not in listed:
            problems.append(f"{rows[0].doc}: the table of {cap.op} leaves out the shipped provider {cap.name!r}")
    return problems


def _prose(text: str) -> list[tuple[int, str]]:
    """(line, sentence) of the prose of ``text``: code blocks and tables left out."""
    out: list[tuple[int, str]] = []
    fenced = False
    para: list[str] = []
    start = 0
    for n, line in enumerate([*text.splitlines(), ""], 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("|") or not line.strip():
            if para:
                out += [(start, s) for s in re.split(r"(?<=[.;])\s+", " ".join(para))]
            para = []
            continue
        if not para:
            start = n
        para.append(line.strip())
    return out


def prose_problems(text: str, doc: str, caps: list[tuple[str, Capability]]) -> list[str]:
    """Sentences that say what a named shipped provider declares, and get it wrong or say it restrictively."""
    names = {c.name for _, c in caps}
    problems: list[str] = []
    for line, sentence in _prose(text):
        if not re.search(r"\bdeclar", sentence, re.IGNORECASE):
            continue
        words = {w.lower() for w in re.findall(r"[A-Za-z0-9_]+", sentence)}
        named = names & words
        said_dtypes = {DTYPES[w] for w in words if w in DTYPES}
        said_features = FEATURES & words
        if not named or not (said_dtypes or said_features):
            continue
        where = f"{doc}:{line}: {sentence[:160]!r}"
        if RESTRICTIVE.search(sentence):
            problems.append(
                f"{where}: a restrictive claim about what {sorted(named)} declare belongs in a "
                "capability table (| op | provider | dtypes | features |), which this test checks whole"
            )
            continue
        for name in sorted(named):
            mine = [c for _, c in caps if c.name == name]
            dtypes = set().union(*(c.dtypes for c in mine))
            features = {f.value for c in mine for f in c.features}
            if not said_dtypes <= dtypes or not said_features <= features:
                problems.append(f"{where}: {name!r} declares dtypes {sorted(dtypes)} and features {sorted(features)}")
    return problems


def doc_problems(text: str, doc: str, caps: list[tuple[str, Capability]]) -> list[str]:
    problems = [p for table in capability_tables(text, doc) for p in table_problems(table, caps)]
    return problems + prose_problems(text, doc, caps)


@pytest.fixture(scope="module")
def caps() -> list[tuple[str, Capability]]:
    found = shipped_capabilities()
    assert {c.op for _, c in found} >= {"attention", "moe_route", "moe_experts", "rmsnorm"}
    return found


def test_every_doc_states_provider_capabilities_as_the_descriptors_declare(caps: list[tuple[str, Capability]]) -> None:
    problems = [p for doc in DOCS for p in doc_problems(doc.read_text(), doc.relative_to(ROOT).as_posix(), caps)]
    assert not problems, "\n".join(problems)


def test_the_moe_capability_table_exists(caps: list[tuple[str, Capability]]) -> None:
    tables = capability_tables((ROOT / "docs" / "operators.md").read_text(), "docs/operators.md")
    ops = {_cell(r.cells.get("op", "")) for t in tables for r in t}
    assert {"moe_route", "moe_experts"} <= ops


TODAYS_3_6 = """Upstream used the fused path only for BF16 on an accelerator, outside deterministic mode and outside
`torch.compile`, and on CUDA only from 4096 local tokens (measured on an H20). Here the Triton
provider declares BF16 only and neither the deterministic nor the compiling feature; the token
threshold was dropped because the fused path won at every token count measured on the H200.
"""


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        (TODAYS_3_6, "restrictive claim"),
        ("The `triton` provider declares `softcap`.\n", "'triton' declares"),
        (
            "| op | provider | dtypes | features |\n| --- | --- | --- | --- |\n"
            "| `moe_experts` | `triton` | BF16 | deterministic, compiling |\n"
            "| `moe_experts` | `reference` | FP32, BF16, FP16 | deterministic, compiling |\n",
            "dtypes ['bfloat16']",
        ),
        ("| op | provider | features |\n| --- | --- | --- |\n| `moe_experts` | `triton` | — |\n", "features []"),
        (
            "| op | provider | dtypes |\n| --- | --- | --- |\n| `moe_experts` | `triton` | BF16, FP16, FP32 |\n",
            "leaves out the shipped provider 'reference'",
        ),
    ],
    ids=["prose-3.6-before-the-fix", "prose-false", "table-dtypes", "table-features", "table-incomplete"],
)
def test_a_doc_that_disagrees_with_the_descriptors_is_caught(
    text: str, complaint: str, caps: list[tuple[str, Capability]]
) -> None:
    problems = doc_problems(text, "doc.md", caps)
    assert any(complaint in p for p in problems), problems


def test_a_true_table_and_true_prose_pass(caps: list[tuple[str, Capability]]) -> None:
    text = (
        "The Triton descriptor declares `compiling`.\n\n"
        "| op | provider | dtypes | features |\n| --- | --- | --- | --- |\n"
        + "".join(
            f"| `{c.op}` | `{c.name}` | {', '.join(c.dtypes)} | {', '.join(sorted(f.value for f in c.features))} |\n"
            for _, c in caps
            if c.op == "moe_experts"
        )
    )
    assert doc_problems(text, "doc.md", caps) == []
