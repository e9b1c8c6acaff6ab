"""The CLI's table layer: fitted to a terminal without breaking a word, plain records when piped."""

from __future__ import annotations

import pytest

from magi2_core.cli._output import wrap
from magi2_core.cli._table import Column, render

COLUMNS = (
    Column("op"),
    Column("provider"),
    Column("features", droppable=True),
    Column("rules", droppable=True),
    Column("usable here"),
)
ROWS = [
    ["attention", "reference", "compiling,deterministic,gqa,lse,sinks,softcap", "-", "yes (cpu)"],
    [
        "moe_route",
        "triton_fused",
        "compiling,deterministic,route_no_norm,route_softmax",
        "short: tokens < 64\nlong: tokens >= 4096",
        "no: needs cuda | musa; this machine has cpu",
    ],
]
WORDS = {
    "attention",
    "reference",
    "compiling,",
    "deterministic,",
    "gqa,",
    "lse,",
    "sinks,",
    "softcap",
    "moe_route",
    "triton_fused",
    "route_no_norm,",
    "route_softmax",
    "yes",
    "(cpu)",
    "no:",
    "needs",
    "cuda",
    "|",
    "musa;",
    "this",
    "machine",
    "has",
    "cpu",
    "short:",
    "tokens",
    "<",
    "64",
    "long:",
    ">=",
    "4096",
    "-",
    "op",
    "provider",
    "features",
    "rules",
    "usable",
    "here",
    "deterministic,gqa,",
    "lse,sinks,",
    "compiling,deterministic,",
    "route_no_norm,route_softmax",
    "gqa,lse,",
    "sinks,softcap",
    "gqa,lse,sinks,",
    "lse,sinks,softcap",
    "deterministic,gqa,lse,",
    "compiling,gqa,",
}


def _cells(text: str) -> list[str]:
    return [cell.strip() for line in text.splitlines() if "│" in line for cell in line.split("│")]


@pytest.mark.parametrize("width", [40, 50, 60, 80, 120])
def test_a_table_fits_the_width_and_breaks_lines_only_between_words(width: int) -> None:
    text = render(None, COLUMNS, ROWS, width=width)
    assert all(len(line) <= width for line in text.splitlines()), text
    for cell in _cells(text):  # every piece of a cell is whole words (cut after a space or a comma)
        for piece in cell.replace(",", ", ").split():
            assert piece in {w for word in WORDS for w in word.replace(",", ", ").split()}, (piece, text)


def test_a_narrow_terminal_leaves_out_droppable_columns_and_says_so() -> None:
    text = render(None, COLUMNS, ROWS, width=50)
    assert "(not shown to fit 50 columns: features, rules; --wide shows every column)" in " ".join(text.split())
    assert "rules" not in text.split("(not shown")[0]
    wide = render(None, COLUMNS, ROWS, width=50, wide=True)
    assert "not shown" not in wide and "route_softmax" in wide and "long: tokens" in wide


def test_an_empty_droppable_column_goes_first() -> None:
    rows = [[*ROWS[0]], [*ROWS[1][:3], "-", ROWS[1][4]]]
    text = render(None, COLUMNS, rows, width=55)
    assert "(not shown to fit 55 columns: rules;" in text and "route_softmax" in text


def test_rows_become_records_when_a_word_is_wider_than_a_column_can_be() -> None:
    rows = [["broken", "see https://errors.example.dev/2.14/v/a_very_long_literal_error_name for details"]]
    text = render("quarantined", (Column("entry point"), Column("reason")), rows, width=40)
    assert text.splitlines()[:3] == ["quarantined", "", "entry point: broken"]
    assert "reason: see" in text and "  https://errors.example.dev/2.14/v/a_very_long_literal_error_name" in text


def test_piped_a_table_is_one_aligned_record_per_line_without_box_characters() -> None:
    text = render("title", COLUMNS, ROWS, width=None)
    lines = text.splitlines()
    assert lines[0] == "title" and len(lines) == 4 and not any(ch in text for ch in "│─┼")
    assert lines[3].index("triton_fused") == lines[2].index("reference") == lines[1].index("provider")
    assert "short: tokens < 64; long: tokens >= 4096" in lines[3]


def test_wrapped_prose_hangs_under_its_text() -> None:
    text = (
        "  1. fa4 (magi2-backend-cuda-fa4 0.1.0 (flash-attn-4 not installed), priority 25): rejected\n"
        "magi2-core        0.1.0 (core contract 2.0) and a long tail of words that must wrap somewhere"
    )
    lines = wrap(text, 50).splitlines()
    assert all(len(line) <= 50 for line in lines)
    assert lines[1].startswith("     ") and not lines[1].startswith("      ")  # under "fa4"
    assert lines[-1].startswith(" " * 18) and lines[-1][18] != " "  # under the value column
    assert wrap(text, None) == text
