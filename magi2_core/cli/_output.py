"""Shared output helpers: one console, JSON printing."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

# Piped output (CI logs, files) gets a fixed, wide layout instead of rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 140)
err_console = Console(stderr=True)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))
