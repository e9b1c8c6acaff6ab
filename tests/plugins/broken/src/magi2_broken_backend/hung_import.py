"""Hangs at import for ``BROKEN_PLUGIN_HANG_S`` seconds, as a backend stuck on a network filesystem or
waiting for a device driver would (tests/test_registry.py sets it). Unset, it fails at once."""

import os
import time

_SECONDS = float(os.environ.get("BROKEN_PLUGIN_HANG_S") or 0)
if _SECONDS <= 0:
    raise ImportError("a stand-in for a hung import: set BROKEN_PLUGIN_HANG_S=<seconds> to make it hang")
time.sleep(_SECONDS)
raise ImportError(f"hung for {_SECONDS:g} s at import")
