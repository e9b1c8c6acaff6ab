"""Version of the core package and of the contract API that backends implement."""

__version__ = "0.1.0"

# The operator contracts (signatures, semantics, descriptor schema) that backends implement.
# A backend declares the range it supports (``core_api`` in its BackendSpec); a mismatch
# quarantines it. Bump the major on incompatible contract changes.
CORE_API_VERSION = "1.0"
