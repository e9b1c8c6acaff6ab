"""Which accelerators are present, without being fooled by torchada and without importing it elsewhere.

On MUSA, torchada makes MUSA tensors report ``is_cuda=True`` while ``torch.cuda.is_available()`` stays
False, and ``torch.musa`` exists only once torch_musa is imported. So MUSA is detected from
``torch.version.musa`` or an installed ``torch_musa``; only then are torchada (first, as the MUSA stack
requires) and torch_musa imported. On other platforms neither is imported: torchada sets environment
variables even on a CPU. Problems are keyed by ``tensor.device.type``, never by ``is_cuda``.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache

import torch

from magi2_core.reasons import Reason, ReasonCode

__all__ = ["absent_device", "cuda_available", "device_identity", "musa_available", "musa_installed"]


def musa_installed() -> bool:
    """A MUSA build of torch, or torch_musa installed: imports nothing (see :func:`musa_available`)."""
    if getattr(torch.version, "musa", None) is not None:
        return True
    try:
        return importlib.util.find_spec("torch_musa") is not None
    except (ImportError, ValueError):  # a broken parent package or a half-initialised module
        return False


@cache
def musa_available() -> bool:
    """A MUSA device is usable: imports torchada then torch_musa, on MUSA installs only."""
    if not musa_installed():
        return False
    try:
        if importlib.util.find_spec("torchada") is not None:
            importlib.import_module("torchada")
        importlib.import_module("torch_musa")
    except ImportError:
        return False
    musa = getattr(torch, "musa", None)
    return bool(musa is not None and musa.is_available())


def cuda_available() -> bool:
    """A real CUDA device (not torchada's alias: on MUSA, torch.cuda.is_available() stays False)."""
    return bool(torch.cuda.is_available()) and getattr(torch.version, "musa", None) is None


def absent_device(device_type: str) -> list[Reason]:
    """One ``unavailable`` reason when ``device_type`` is CUDA or MUSA and this host has none.

    Every provider that needs the device says so in these words, so that ``magi2 explain --device cuda``
    on a host without CUDA rejects the providers of every op alike (instead of one op rejecting its
    provider and another choosing it).
    """
    if device_type == "cuda" and not cuda_available():
        return [Reason(code=ReasonCode.UNAVAILABLE, field="cuda", expected="a CUDA device", actual="none visible")]
    if device_type == "musa" and not musa_available():
        return [
            Reason(
                code=ReasonCode.UNAVAILABLE,
                field="musa",
                expected="torch_musa with a MUSA device",
                actual="none visible",
            )
        ]
    return []


@cache
def device_identity(device_type: str, index: int | None = None) -> tuple[str | None, str | None]:
    """``(name, "major.minor")`` of a CUDA or MUSA device as torch reports them, read once per device
    (``index`` None: the current device); ``(None, None)`` for other device types, or a device that is
    not there. This is what device profiles are keyed by (:mod:`magi2_core.profiles`)."""
    if device_type == "cuda" and cuda_available():
        module = torch.cuda
    elif device_type == "musa" and musa_available():
        module = getattr(torch, "musa")  # noqa: B009 (exists once torch_musa is imported)
    else:
        return None, None
    try:
        where = module.current_device() if index is None else index
        major, minor = module.get_device_capability(where)
        return str(module.get_device_name(where)), f"{major}.{minor}"
    except (RuntimeError, AssertionError, AttributeError, ValueError):  # an index past the device count, ...
        return None, None
