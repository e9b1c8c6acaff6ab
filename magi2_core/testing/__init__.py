"""The conformance kit: cases generated from capability descriptors, checked against the reference.

Run it with pytest (``pytest -p magi2_core.testing.plugin --magi2-provider NAME``; the plugin is also
registered under ``pytest11``) or from the command line (``magi2 check --provider NAME``). See
``docs/writing-a-backend.md``.

The names below load on first use (PEP 562): pytest auto-loads ``magi2_core.testing.plugin`` in every
session, and importing this package must not import torch for a run that never uses the kit.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from magi2_core.testing.cases import Case
    from magi2_core.testing.frames import magi2_frames_at
    from magi2_core.testing.op_cases import generate_cases
    from magi2_core.testing.records import call_record
    from magi2_core.testing.register import InProcessBackend, registered_backend, rehost
    from magi2_core.testing.runner import (
        CaseResult,
        KitReport,
        Plan,
        ProviderSkip,
        ValidationCase,
        available_device_types,
        plan,
        run_case,
        run_kit,
    )

_MODULE_OF = {
    "Case": "cases",
    "generate_cases": "op_cases",
    "magi2_frames_at": "frames",
    "call_record": "records",
    "InProcessBackend": "register",
    "registered_backend": "register",
    "rehost": "register",
    "CaseResult": "runner",
    "KitReport": "runner",
    "Plan": "runner",
    "ProviderSkip": "runner",
    "ValidationCase": "runner",
    "available_device_types": "runner",
    "plan": "runner",
    "run_case": "runner",
    "run_kit": "runner",
}

__all__ = [
    "Case",
    "InProcessBackend",
    "CaseResult",
    "KitReport",
    "Plan",
    "ProviderSkip",
    "ValidationCase",
    "available_device_types",
    "call_record",
    "generate_cases",
    "magi2_frames_at",
    "plan",
    "registered_backend",
    "rehost",
    "run_case",
    "run_kit",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'magi2_core.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"magi2_core.testing.{module}"), name)
    globals()[name] = value
    return value
