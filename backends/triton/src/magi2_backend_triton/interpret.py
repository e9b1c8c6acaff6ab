"""Is Triton running kernels through its interpreter (``TRITON_INTERPRET=1``)? The one place that asks.

Imports nothing heavy, so the plugin's descriptors can use it. Read on every call (an environment
lookup), not cached: the interpreter is chosen by Triton per process, and tests switch the variable.
"""

from __future__ import annotations

import os

__all__ = ["interpreting"]


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (kernels run on the CPU through numpy)."""
    return os.environ.get("TRITON_INTERPRET") == "1"
