"""Implements a contract version this core does not provide."""

from magi2_core import BackendSpec


def magi2_backend() -> BackendSpec:
    return BackendSpec(name="magi2-backend-broken-api", version="0.0.1", core_api=">=9,<10", providers=())
