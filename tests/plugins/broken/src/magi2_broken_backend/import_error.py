"""Fails at import, as a backend with a missing native dependency would."""

import magi2_no_such_native_extension  # noqa: F401
