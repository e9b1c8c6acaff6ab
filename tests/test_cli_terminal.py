"""The commands in an 80-column terminal (a pseudo-terminal with ``COLUMNS=80``), and piped.

In the terminal no line is wider than 80 columns and no word is broken: every word shown is a word of
the same command's piped output, which is never wrapped (a word folded across lines, such as
``attentio`` + ``n``, shows fragments that the piped output does not have). Piped, tables have no box
characters.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time

import pytest

COLUMNS = 80
_ANSI = re.compile(r"\x1b(?:\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07|[()][A-Z0-9])")
_ART = "│─┼┃━┏┓┗┛┡┩╇"
_TOKEN = re.compile(r"[\s│─┼]+|(?<=,)")
# Live progress (a spinner, a bar) is drawn only on a terminal: its lines are not compared.
_LIVE = re.compile(r"[\u2800-\u28ff━]")
_NUMBER = re.compile(r"^[(]?[\d.:/e+-]+s?[),;]?$")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LINES", "TRITON_INTERPRET")}
    return env | {"COLUMNS": str(COLUMNS), "TERM": "xterm-256color"}


def _in_terminal(args: list[str], timeout: float = 240.0) -> str:
    """What the command shows in an 80-column pseudo-terminal (stdout and stderr), as the screen's lines."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:  # the child: the command, with the pseudo-terminal as stdin, stdout and stderr
        os.execve(sys.executable, [sys.executable, "-m", "magi2_core.cli", *args], _env())
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(fd)
        os.waitpid(pid, 0)
    text = _ANSI.sub("", out.decode("utf-8", "replace")).replace("\r\n", "\n")
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))  # a carriage return redraws


def _piped(args: list[str]) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "magi2_core.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
        timeout=240,
    )
    return result.stdout


def _words(text: str) -> set[str]:
    """The words of ``text`` (a trailing colon dropped: a narrow table prints a row as ``header: value``)."""
    return {t.rstrip(":") for line in text.splitlines() if not _LIVE.search(line) for t in _TOKEN.split(line) if t}


COMMANDS = [
    ["backends"],
    ["explain", "attention"],
    ["explain", "moe_route", "--device", "cuda"],
    ["env"],
    ["demo"],
    ["check", "-k", "rmsnorm[reference]-cpu-float32-2d"],
    ["explain", "attention", "--provider", "fa3"],
    ["overhead", "--iters", "20"],
    ["tune", "--show", "--device", "cpu"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=["-".join(a[:2]) for a in COMMANDS])
def test_every_command_fits_80_columns_without_breaking_a_word(args: list[str]) -> None:
    screen = _in_terminal(args)
    assert "Traceback" not in screen, screen[-3000:]
    wide = [line for line in screen.splitlines() if len(line) > COLUMNS]
    assert not wide, "\n".join(wide)
    piped = _piped(args)
    assert not any(ch in piped for ch in _ART), piped[:3000]  # piped: no table art
    notes = re.compile(r"^\(not shown to fit")  # the terminal's own note on the columns it left out
    shown = _words("\n".join(line for line in screen.splitlines() if not notes.match(line)))
    broken = sorted(w for w in shown - _words(piped) if not _NUMBER.match(w))
    assert not broken, f"words in the terminal that the piped output does not have: {broken}\n{screen}"


def test_wide_shows_every_column_that_a_narrow_terminal_leaves_out() -> None:
    narrow = _in_terminal(["backends"])
    assert "(not shown to fit 80 columns: rules; --wide shows every column)" in narrow
    wide = _in_terminal(["backends", "--wide"])
    assert "not shown" not in wide and "rules" in wide


def test_piped_tables_are_one_record_per_line() -> None:
    piped = _piped(["backends"])
    rows = [line.split() for line in piped.splitlines() if line.startswith("attention ")]
    assert rows and all(row[1] in piped for row in rows)
    reference = next(line for line in piped.splitlines() if line.split()[:2] == ["attention", "reference"])
    assert "fp32,bf16,fp16" in reference and "yes (cpu)" in reference  # the whole record on its line


def test_an_error_in_a_terminal_wraps_at_words() -> None:
    screen = _in_terminal(["explain", "attention", "--provider", "nope"])
    lines = [line for line in screen.splitlines() if line.strip() and not line.startswith("magi2_core: ")]
    error = lines[lines.index(next(x for x in lines if x.startswith("magi2 explain: error: "))) :]
    assert len(error) > 1 and all(len(x) <= COLUMNS for x in error)
    assert all(x.startswith("  ") for x in error[1:])  # continuations indented under the first line
