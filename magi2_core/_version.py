"""Version of the core package and of the contract API that backends implement."""

__version__ = "0.1.0"

# The operator contracts (signatures, semantics, descriptor schema) that backends implement.
# A backend declares the range it supports (``core_api`` in its BackendSpec); a mismatch
# quarantines it. Bump the major on incompatible contract changes.
CORE_API_VERSION = "2.0"

# What changed in the contract since each earlier major, by that major: a backend built for it is
# quarantined with this reason ("built for core API 1, this is 2; ...; upgrade the backend").
CHANGED_SINCE: dict[int, str] = {
    1: "providers now receive one call record (see docs/writing-a-backend.md)",
}
