"""The old name of :mod:`magi2_core.reasons` (why a call resolved as it did), kept for code that imports it."""

from magi2_core.reasons import *  # noqa: F403
from magi2_core.reasons import __all__  # noqa: F401
