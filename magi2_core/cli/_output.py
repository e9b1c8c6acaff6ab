"""Shared output helpers: one console, JSON printing, one-line usage errors."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

# Piped output (CI logs, files) gets a fixed, wide layout instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def usage_error(command: str, message: str, *, json_out: bool = False) -> NoReturn:
    """An impossible request: one line on stderr (and a JSON object on stdout with ``--json``), exit 2."""
    if json_out:
        print_json({"error": message, "command": command})
    print(f"magi2 {command}: error: {message}", file=sys.stderr)
    raise typer.Exit(2)
