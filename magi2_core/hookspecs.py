"""The old name of :mod:`magi2_core.model.backend_spec` (a backend's declaration), kept because docs/api.md
named ``magi2_core.hookspecs.hookimpl``; backends import these names from :mod:`magi2_core.backend`."""

from magi2_core.model.backend_spec import *  # noqa: F403
from magi2_core.model.backend_spec import __all__  # noqa: F401
