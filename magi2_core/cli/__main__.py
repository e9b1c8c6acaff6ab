"""``python -m magi2_core.cli``: the ``magi2`` command where no console script is installed."""

from magi2_core.cli import main

main()
