"""Shared output helpers: one console, JSON printing, one-line usage errors."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console

if TYPE_CHECKING:
    from magi2_core.errors import Magi2Error

F = TypeVar("F", bound=Callable[..., Any])

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


def one_line(exc: Magi2Error) -> str:
    """A typed error as one line: its message, and for a forced provider that cannot serve the call,
    that provider's reasons (a Resolution error's full explanation is what ``magi2 explain`` prints)."""
    from magi2_core.errors import ProviderNotEligibleError, ResolutionError
    from magi2_core.reasons import Verdict

    text = str(exc)
    if isinstance(exc, ResolutionError) and exc.resolution is not None:
        text = text.split("\n\n", 1)[0]
        if isinstance(exc, ProviderNotEligibleError):
            why = [str(r) for c in exc.resolution.candidates if c.verdict == Verdict.REJECTED for r in c.reasons]
            text += ": " + "; ".join(why) + " (`magi2 explain` shows every candidate)"
    return " ".join(text.split())


def typed_errors(command: str) -> Callable[[F], F]:
    """Run a command with every ``MAGI2_*`` variable validated first; a :class:`Magi2Error` escaping
    it (a bad variable, an unknown or unservable forced provider) is a one-line usage error, exit 2."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            from magi2_core import config
            from magi2_core.errors import Magi2Error

            try:
                config.effective()
                return fn(*args, **kwargs)
            except Magi2Error as exc:
                usage_error(command, f"{type(exc).__name__}: {one_line(exc)}", json_out=bool(kwargs.get("json_out")))

        return run  # type: ignore[return-value]

    return wrap
