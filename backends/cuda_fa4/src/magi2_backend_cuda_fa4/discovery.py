"""Whether FlashAttention-4 is installed, found from packaging alone (the CuTe DSL is not imported).

FA4 ships as the distribution ``flash-attn-4`` with the module ``flash_attn.cute``. Its wheel has no
``flash_attn/__init__.py`` (``flash_attn`` is a namespace package), and ``flash_attn.cute.__version__``
reads a distribution named ``fa4`` that does not exist, so the version comes from the metadata of
``flash-attn-4``. Importing the module costs seconds (the CuTe DSL and its MLIR bindings), which is
why the descriptor is built from this module only.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

__all__ = ["DISTRIBUTION", "DSL_DISTRIBUTION", "MODULE", "FA4Install", "dist_version", "installed"]

DISTRIBUTION = "flash-attn-4"
DSL_DISTRIBUTION = "nvidia-cutlass-dsl"
MODULE = "flash_attn.cute"


@dataclass(frozen=True)
class FA4Install:
    """The installed FA4 build and the CuTe DSL under it, as their packaging reports them."""

    version: str
    dsl_version: str | None

    @property
    def label(self) -> str:
        """``flash-attn-4 4.0.0b36 (nvidia-cutlass-dsl 4.8.1)``: what reasons and the descriptor name."""
        return f"{DISTRIBUTION} {self.version} ({DSL_DISTRIBUTION} {self.dsl_version or 'not installed'})"


def dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed() -> FA4Install | None:
    """The installed FA4 distribution, or ``None``."""
    version = dist_version(DISTRIBUTION)
    if version is None:
        return None
    return FA4Install(version, dist_version(DSL_DISTRIBUTION))
