"""The conformance kit: cases generated from capability descriptors, checked against the reference.

Run it with pytest (``pytest -p magi2_core.testing.plugin --magi2-provider NAME``; the plugin is also
registered under ``pytest11``) or from the command line (``magi2 check --provider NAME``). See
``docs/writing-a-backend.md``.
"""

from magi2_core.testing.cases import Case, generate_cases
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

__all__ = [
    "Case",
    "InProcessBackend",
    "CaseResult",
    "KitReport",
    "Plan",
    "ProviderSkip",
    "ValidationCase",
    "available_device_types",
    "generate_cases",
    "plan",
    "registered_backend",
    "rehost",
    "run_case",
    "run_kit",
]
