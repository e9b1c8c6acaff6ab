"""The ``magi2`` command line: ``backends``, ``env``, ``explain``, ``demo``, ``check``, ``overhead``
(``bench``: its earlier name, kept as an alias), ``tune``.

Readable tables by default, ``--json`` everywhere. One module per subcommand. Importing this package
imports typer and rich only: each command imports torch and the registry when it runs, so
``magi2 -h`` and ``magi2 --version`` answer without loading torch (``tests/test_cli_startup.py``).
"""

from __future__ import annotations

import warnings
from typing import Annotated

import typer

from magi2_core._version import CORE_API_VERSION, __version__
from magi2_core.cli import backends, check, demo, env, explain, overhead, tune
from magi2_core.cli._output import OneLineErrors, fit_warnings, typed_errors

# torch warns at import when numpy is missing. numpy is a dependency of magi2-core for that reason alone
# (magi2 does not use it), so an environment without it still gets no warning it could not act on.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)

app = typer.Typer(
    name="magi2",
    cls=OneLineErrors,
    help="MAGI-2 kernel-backend registry: list backends, report the environment, explain resolutions, "
    "run the demo, check providers, tune this device's profile.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click help: typer's rich help renderer imports markdown-it and doubles the start-up time.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"magi2-core {__version__} (core contract {CORE_API_VERSION})")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", "-V", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """MAGI-2 kernel-backend registry."""


for _name, _command in (
    ("backends", backends.backends),
    ("env", env.env),
    ("explain", explain.explain),
    ("demo", demo.demo),
    ("check", check.check),
    ("overhead", overhead.overhead),
    ("tune", tune.tune),
):
    app.command(_name)(typed_errors(_name)(_command))
# The earlier name of `magi2 overhead`, kept for scripts that call it (hidden from the help).
app.command("bench", hidden=True)(typed_errors("bench")(overhead.overhead))


def main() -> None:
    fit_warnings()
    app()
