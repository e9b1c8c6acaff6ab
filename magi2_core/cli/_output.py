"""Shared output helpers: one console, JSON printing, text fitted to the terminal, one-line usage errors.

On a terminal, text is wrapped at spaces to its width (``COLUMNS`` or the terminal's size), each
continuation indented under its line's text; piped, text is printed as it is, one line per line.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import shutil
import sys
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from typer.core import TyperGroup

try:  # typer vendors click from 0.24 on; earlier versions use click itself
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - an older typer
    from click.exceptions import ClickException  # type: ignore[import-not-found, no-redef, unused-ignore]

if TYPE_CHECKING:
    from magi2_core.errors import Magi2Error

F = TypeVar("F", bound=Callable[..., Any])

# Progress bars, spinners and rules only: text goes through say(), tables through _table.render().
console = Console()
err_console = Console(stderr=True)

# Where a wrapped line's continuations start: under a list item's text ("- ", "3. "), under the value
# of an aligned "key   value" line, else two columns in.
_HANG = re.compile(r"(?P<indent> *)(?:(?P<item>- |\d+\. )|(?P<key>\S[^ ]*(?: [^ ]+)*? {2,})(?=\S))?")


def terminal_width(stream: Any = None) -> int | None:
    """The columns to fit when ``stream`` (default stdout) is a terminal; None when it is piped."""
    if not (stream or sys.stdout).isatty():
        return None
    return shutil.get_terminal_size().columns


def wrap(text: str, width: int | None) -> str:
    """``text`` with each line wrapped at spaces to ``width`` (None: unchanged). A word longer than the
    width stays whole."""
    if width is None:
        return text
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        m = _HANG.match(line)
        assert m is not None  # every group is optional
        hang = len(m.group(0)) if (m.group("item") or m.group("key")) else len(m.group("indent")) + 2
        hang = min(hang, width // 2)
        out += textwrap.wrap(
            line, width, subsequent_indent=" " * hang, break_long_words=False, break_on_hyphens=False
        ) or [""]
    return "\n".join(out)


def say(text: str, *, err: bool = False) -> None:
    """Print ``text`` to stdout (``err``: stderr), wrapped to the terminal when that stream is one."""
    stream = sys.stderr if err else sys.stdout
    print(wrap(text, terminal_width(stream)), file=stream, flush=True)


class _FittedWarnings(logging.Handler):
    """The library's warnings (a quarantined plugin, an ignored profile) on stderr, wrapped to the terminal."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            say(self.format(record), err=True)
        except Exception:  # logging must never raise into the command
            self.handleError(record)


def fit_warnings() -> None:
    """Route the ``magi2_core`` logger's warnings through :class:`_FittedWarnings` (once)."""
    logger = logging.getLogger("magi2_core")
    if not any(isinstance(h, _FittedWarnings) for h in logger.handlers):
        handler = _FittedWarnings(logging.WARNING)
        logger.addHandler(handler)


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def usage_error(command: str, message: str, *, json_out: bool = False, prefix: str | None = None) -> NoReturn:
    """An impossible request: one line on stderr (wrapped at words on a terminal) and a JSON object on
    stdout with ``--json``; exit 2. ``prefix`` replaces ``magi2 COMMAND`` at the start of the line."""
    if json_out:
        print_json({"error": message, "command": command})
    say(f"{prefix or f'magi2 {command}'}: error: {message}", err=True)
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


class OneLineErrors(TyperGroup):
    """The ``magi2`` group, whose command-line mistakes (an unknown command, option or value) are one line
    on stderr, as :func:`usage_error`'s are, instead of click's usage block; raised while the arguments
    are parsed, so before any command imports torch."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        try:
            try:
                code = super().main(
                    argv,
                    prog_name,
                    complete_var,
                    standalone_mode=False,
                    windows_expand_args=windows_expand_args,
                    **extra,
                )
            except ClickException as exc:
                if type(exc).__name__ == "NoArgsIsHelpError":  # bare `magi2`: click's help is the answer
                    exc.show()
                    raise typer.Exit(exc.exit_code) from None
                ctx = getattr(exc, "ctx", None)
                command = ctx.info_name if ctx is not None and ctx.parent is not None else None
                where = f"magi2 {command}" if command else "magi2"
                hint = "" if isinstance(exc, typer.BadParameter) else f" (`{where} -h` lists what it takes)"
                usage_error(command or "", exc.format_message() + hint, json_out="--json" in argv, prefix=where)
            except typer.Abort:
                code = 1
        except typer.Exit as exc:
            code = exc.exit_code
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)
