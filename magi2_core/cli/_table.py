"""Tables that fit the reader's terminal, and plain aligned text when piped.

On a terminal a table is fitted to its width: cells wrap at spaces and after commas, never inside a
word; when the columns cannot fit even so, the columns marked droppable go (an empty one first, then
from the last) and a line under the table names them and ``--wide``, which keeps every column; when
even that cannot fit (a word wider than a column can be), each row is printed as ``header: value``
lines. Piped (``width=None``), a table is one record per line: columns aligned with spaces, no box
characters, a multi-line cell joined by ``"; "``, nothing wrapped, so ``grep`` and ``cut`` see whole
records.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from magi2_core.cli._output import wrap

__all__ = ["WIDE_HELP", "Column", "render"]

WIDE_HELP = "show every column, however wide (a narrow terminal otherwise leaves some out)"
_GAP = " │ "  # between two columns on a terminal
_PLAIN_GAP = "  "  # between two columns when piped
# A cell breaks after a space or a comma (the lists of devices, dtypes and features have no spaces).
_BREAK = re.compile(r"(?<=[ ,])")


@dataclass(frozen=True)
class Column:
    """A column: its header, and whether it may be left out to fit a narrow terminal (``--wide`` keeps it)."""

    header: str
    droppable: bool = False
    # The narrowest this column is squeezed to (prose wraps badly when narrower) before any droppable
    # column is left out; below it only when nothing else fits.
    floor: int = 0


def _tokens(text: str) -> list[str]:
    return [t for t in _BREAK.split(text) if t]


def _min_width(text: str) -> int:
    """The narrowest width that wraps ``text`` without breaking a word: its longest unbreakable piece."""
    return max((len(t.rstrip()) for line in text.split("\n") for t in _tokens(line)), default=0)


def _natural_width(text: str) -> int:
    return max((len(line) for line in text.split("\n")), default=0)


def _wrap_cell(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``, broken only after a space or a comma (a piece wider than
    ``width``, which fitting prevents, stays whole)."""
    out: list[str] = []
    for line in text.split("\n"):
        current = ""
        for token in _tokens(line):
            if current and len((current + token).rstrip()) > width:
                out.append(current.rstrip())
                current = token.lstrip()
            else:
                current += token
        out.append(current.rstrip())
    return out


def _widths(cells: list[list[str]], width: int, floors: Sequence[int]) -> list[int] | None:
    """Column widths that fit ``width`` (the gaps included) without breaking a word, none narrower than
    its floor or its natural width, whichever is less; None if none do."""
    n = len(cells[0])
    natural = [max(_natural_width(row[i]) for row in cells) for i in range(n)]
    least = [max(max(_min_width(row[i]) for row in cells), min(floors[i], natural[i])) for i in range(n)]
    room = width - len(_GAP) * (n - 1)
    if sum(least) > room:
        return None
    # The room beyond the least widths goes to each column in proportion to what it lacks of its natural
    # width (the remainder, one column at a time, to those that lack the most).
    lack = [natural[i] - least[i] for i in range(n)]
    spare = min(room - sum(least), sum(lack))
    widths = [least[i] + (spare * lack[i] // sum(lack) if sum(lack) else 0) for i in range(n)]
    for i in sorted(range(n), key=lambda j: widths[j] - natural[j]):
        if sum(widths) >= sum(least) + spare:
            break
        if widths[i] < natural[i]:
            widths[i] += 1
    return widths


def _plain(title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    cells = [[c.header for c in columns], *([cell.replace("\n", "; ") for cell in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = [_PLAIN_GAP.join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(([title] if title else []) + lines)


def _records(title: str | None, columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> str:
    """Each row as a block of ``header: value`` lines, wrapped to ``width``; a blank line between rows."""
    blocks = [wrap(title, width)] if title else []
    for row in rows:
        fields = [f"{c.header}: " + cell.replace("\n", "\n  ") for c, cell in zip(columns, row, strict=True)]
        blocks.append(wrap("\n".join(fields), width))
    return "\n\n".join(blocks)


def render(
    title: str | None,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    width: int | None,
    wide: bool = False,
) -> str:
    """The table as text: fitted to ``width`` columns on a terminal, or plain aligned records when
    ``width`` is None (piped). ``wide`` keeps every column, however wide the result."""
    if width is None:
        return _plain(title, columns, rows)
    keep = list(range(len(columns)))
    dropped: list[str] = []
    cells = [[c.header for c in columns], *(list(row) for row in rows)]
    fitted = _widths(cells, width, [c.floor for c in columns])
    # Dropped first: a droppable column with nothing in it, then the droppable ones from the last.
    empty = {i for i in range(len(columns)) if all(row[i] in ("", "-") for row in rows)}
    droppable = sorted((i for i, c in enumerate(columns) if c.droppable), key=lambda i: (i not in empty, -i))
    while fitted is None and not wide and droppable:
        gone = droppable.pop(0)
        keep.remove(gone)
        dropped = [c.header for i, c in enumerate(columns) if i not in keep]
        fitted = _widths([[row[i] for i in keep] for row in cells], width, [columns[i].floor for i in keep])
    shown = [[row[i] for i in keep] for row in cells]
    if fitted is None:  # squeeze what is left below the floors
        fitted = _widths(shown, width, [0] * len(keep))
    if fitted is None and not wide:  # a word wider than any column can be: one "header: value" line a field
        return _records(title, columns, rows, width)
    if fitted is None:  # --wide on a narrow terminal: one line a row, past the terminal's edge
        fitted = [max(_natural_width(row[i]) for row in shown) for i in range(len(keep))]
    wrapped = [[_wrap_cell(cell, w) for cell, w in zip(row, fitted, strict=True)] for row in shown]
    multi = any(len(cell) > 1 for row in wrapped[1:] for cell in row)
    rule = "─┼─".join("─" * w for w in fitted)
    out = [wrap(title, width)] if title else []
    for r, row in enumerate(wrapped):
        if r == 1 or (r > 1 and multi):  # under the header; between rows when a row spans several lines
            out.append(rule)
        for k in range(max(len(cell) for cell in row)):
            parts = [(cell[k] if k < len(cell) else "").ljust(w) for cell, w in zip(row, fitted, strict=True)]
            out.append(_GAP.join(parts).rstrip())
    if dropped:
        out.append(wrap(f"(not shown to fit {width} columns: {', '.join(dropped)}; --wide shows every column)", width))
    return "\n".join(out)
