"""What the FlashAttention providers (FA3 here, FA4 in magi2-backend-cuda-fa4) share.

A build imported on first use and cached for the process, the core's sink correction for CUDA, and
the device's compute capability: each one a callable given to the constructor, so the tests hand
in fakes. Subclasses name their build (``label``) and its loader (``default_loader``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import ClassVar, Generic, Protocol, TypeVar

import torch

from magi2_core.backend import Reason, ReasonCode, SinkCorrection, sink_correction_for

__all__ = ["FlashAttentionProvider", "Loaded", "capability_unknown", "cuda_sink_correction", "device_capability"]

AbiT = TypeVar("AbiT")
AbiT_co = TypeVar("AbiT_co", covariant=True)


class Loaded(Protocol[AbiT_co]):
    """A loader's result: the usable build's ABI, or ``None`` and why."""

    @property
    def abi(self) -> AbiT_co | None: ...

    def why_none(self) -> str: ...


def device_capability(index: int | None = None) -> tuple[int, int] | None:
    """The compute capability of CUDA device ``index`` (``None``: the current one), or ``None`` without
    a usable CUDA device. A multi-GPU host may mix models, so the problem's device index is asked."""
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


def capability_unknown(label: str) -> Reason:
    """The reason a FlashAttention provider gives for a described device without a compute capability."""
    return Reason(
        code=ReasonCode.CHECK,
        field="compute_capability",
        expected="a known compute capability",
        actual="unknown",
        detail=f"{label} runs on some capabilities only: describe the device with one",
    )


def cuda_sink_correction() -> SinkCorrection:
    """The correction that the core chose for CUDA (these providers run on CUDA only)."""
    return sink_correction_for("cuda")


class FlashAttentionProvider(Generic[AbiT]):
    """The shared part of a FlashAttention kernel object (see the module doc)."""

    label: ClassVar[str]  # the build family in messages: "FA3", "FA4"
    default_loader: ClassVar[Callable[[], Loaded[object]]]

    def __init__(
        self,
        loader: Callable[[], Loaded[AbiT]] | None = None,
        correction: Callable[[], SinkCorrection] = cuda_sink_correction,
        capability: Callable[[int | None], tuple[int, int] | None] = device_capability,
    ) -> None:
        self._loader = loader if loader is not None else type(self).default_loader
        self._correction = correction
        self._capability = capability

    @cached_property
    def loaded(self) -> Loaded[AbiT]:
        """The build in use (imported on first use, then cached for the process)."""
        return self._loader()  # type: ignore[return-value]  # default_loader is the subclass's own

    @property
    def sink_correction(self) -> SinkCorrection:
        """The correction that applies sinks after a call without them (the core's choice for CUDA)."""
        return self._correction()

    def _abi(self) -> AbiT:
        abi = self.loaded.abi
        if abi is None:
            raise RuntimeError(
                f"{self.label} provider called without a usable {self.label} build: {self.loaded.why_none()}"
            )
        return abi
