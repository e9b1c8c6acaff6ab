"""What is installed and usable on this machine: the report behind ``magi2 env`` and ``magi2 backends``.

Versions come from package metadata where possible (nothing is imported to learn a version); torch is
imported to see devices, and each provider's kernel module is imported to ask it whether it can run
here, exactly as the resolver would on a first call.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any

import torch

from magi2_core import config
from magi2_core._version import CORE_API_VERSION, __version__
from magi2_core.errors import ResolutionError
from magi2_core.model.capability import Capability
from magi2_core.model.devices import cuda_available, musa_available
from magi2_core.model.problem import OPS, Problem
from magi2_core.selection.registry import Registry, get_registry
from magi2_core.selection.resolver import invalid_env_overrides, resolve_problem

__all__ = ["ProviderStatus", "environment_report", "present_device_types", "provider_status"]

# Attention kernel builds the backends look for (distribution names, as pip knows them).
KERNEL_BUILDS = {
    "FA3": ("fa3-fwd", "flash_attn_3", "tokenspeed-fa3"),
    "FA4": ("flash-attn-4", "fa4"),
    "FA2": ("flash-attn",),
    "MATE": ("mate",),
}
_NVIDIA_SMI_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ProviderStatus:
    """Whether a provider can run on some device of this machine, and if not, why."""

    op: str
    provider: str
    backend: str
    usable_on: tuple[str, ...]
    why_not: str

    @property
    def usable(self) -> bool:
        return bool(self.usable_on)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "usable": self.usable}

    def summary(self) -> str:
        return f"yes ({', '.join(self.usable_on)})" if self.usable else f"no: {self.why_not}"


def present_device_types() -> tuple[str, ...]:
    """Device types with a usable device in this process; ``cpu`` always."""
    found = ["cpu"]
    if cuda_available():
        found.append("cuda")
    if musa_available():
        found.append("musa")
    return tuple(found)


def provider_status(cap: Capability, present: tuple[str, ...], registry: Registry | None = None) -> ProviderStatus:
    """Resolve the simplest problem per present device and claimed dtype with this provider forced."""
    devices = present if "*" in cap.device_types else tuple(d for d in cap.device_types if d in present)
    if not devices:
        why = f"needs {' | '.join(cap.device_types)}; this machine has {', '.join(present)}"
        return ProviderStatus(cap.op, cap.name, cap.backend, (), why)
    usable: list[str] = []
    refusals: list[str] = []
    for device in devices:
        for dtype in cap.dtypes:
            try:
                resolve_problem(Problem(op=cap.op, device_type=device, dtype=dtype), cap.name, registry)
            except ResolutionError as exc:
                res = exc.resolution
                reasons = (
                    [] if res is None else [r for c in res.candidates if c.provider == cap.name for r in c.reasons]
                )
                refusals.append(f"{device}/{dtype}: " + ("; ".join(map(str, reasons)) or str(exc)))
                continue
            usable.append(device)
            break
    return ProviderStatus(cap.op, cap.name, cap.backend, tuple(usable), "" if usable else " | ".join(refusals))


def _dist_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    """The NVIDIA driver version from nvidia-smi (torch does not expose it), or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _gpus() -> list[dict[str, Any]]:
    if not cuda_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append(
            {
                "index": i,
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.total_memory / 2**30, 1),
            }
        )
    return out


def overrides_report(registry: Registry | None = None) -> list[dict[str, Any]]:
    """Every ``MAGI2_*`` variable set in the environment, its value, and whether it is valid: a provider
    override must name an installed provider of its ops; any other must be a variable magi2 reads."""
    bad = invalid_env_overrides((registry or get_registry()).state())
    out: list[dict[str, Any]] = []
    for var in sorted(v for v in os.environ if v.startswith("MAGI2_")):
        why = ""
        if var in bad:
            why = f"no provider of that name; valid: {', '.join(bad[var][1])}"
        elif config.owner(var) is None:
            why = "not a variable magi2 or an installed backend reads (docs/configuration.md)"
        out.append({"variable": var, "value": os.environ[var], "valid": not why, "why": why})
    return out


def environment_report(registry: Registry | None = None) -> dict[str, Any]:
    """Everything ``magi2 env`` prints, as plain data."""
    reg = registry or get_registry()
    present = present_device_types()
    statuses = [provider_status(p.capability, present, reg) for op in OPS for p in reg.providers(op)]
    musa_version = getattr(torch.version, "musa", None)
    return {
        "magi2_core": {"version": __version__, "core_api": CORE_API_VERSION},
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "backends": [
            {
                "entry_point": b.entry_point,
                "distribution": b.spec.name,
                "version": b.spec.version,
                "core_api": b.spec.core_api,
            }
            for b in reg.backends()
        ],
        "quarantined": [q.model_dump(mode="json") for q in reg.quarantined()],
        "torch": {
            "version": torch.__version__,
            "cuda_build": torch.version.cuda,
            "hip_build": torch.version.hip,
            "musa_build": musa_version,
            "cuda_available": cuda_available(),
            "gpus": _gpus(),
            "driver": _driver_version(),
        },
        "triton": _dist_version("triton"),
        "musa": {
            "torch_musa": _dist_version("torch_musa"),
            "torchada": _dist_version("torchada"),
            "available": musa_available(),
        },
        "kernel_builds": {
            kind: {d: v for d in dists if (v := _dist_version(d)) is not None} for kind, dists in KERNEL_BUILDS.items()
        },
        "device_types_present": list(present),
        "providers": [s.as_dict() for s in statuses],
        "overrides": overrides_report(reg),
    }
