"""The ``magi2`` command line: ``backends``, ``explain``, ``demo``, ``check``, ``bench``.

Readable tables by default, ``--json`` everywhere. One module per subcommand.
"""

from __future__ import annotations

import importlib

import typer

from magi2_core.cli import backends, bench, demo, explain

app = typer.Typer(
    name="magi2",
    help="MAGI-2 kernel-backend registry: list backends, explain resolutions, run the demo, check providers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("backends")(backends.backends)
app.command("explain")(explain.explain)
app.command("demo")(demo.demo)
app.command("bench")(bench.bench)
try:  # the conformance kit's command is optional at import time
    _check = importlib.import_module("magi2_core.cli.check")
    app.command("check")(_check.check)
except ImportError:  # pragma: no cover - only while the kit is absent
    pass


def main() -> None:
    app()
