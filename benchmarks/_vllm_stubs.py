"""vllm-omni's own MAGI-2 modules, imported unmodified from its released wheel, with vLLM stubbed.

vllm-omni's MAGI-2 model code needs a little of vLLM (a logger factory, vLLM's Triton re-exports, the
platform object, the shared attention layer) and its package initialisers import vLLM's engine.
Where vLLM is not installed (CPU CI; a GPU machine with only torch and Triton), :func:`install` puts
an unpacked wheel on ``sys.path`` and the stand-ins below into ``sys.modules``; every other module is
the wheel's own file, executed as shipped. The tests (``tests/integrations``) and the benchmark
``benchmarks/vllm_omni_stack.py`` both use this module, which is why it lives here: the benchmarks
must not import from the tests, and the installed ``magi2_core`` package must not carry test stubs.

Every stub, and why it exists:

- ``vllm`` (a package with no attributes of its own): vLLM itself; only the submodules below exist.
- ``vllm.logger.init_logger``: vLLM's logger factory; ``logging.getLogger`` here.
- ``vllm.triton_utils`` (``HAS_TRITON``, ``triton``, ``tl``): vLLM's re-export of Triton; the installed
  ``triton``, as vLLM re-exports it when Triton is installed (so vllm-omni's own Triton kernels, its
  fused MoE and mHC, run on a GPU).
- ``vllm.vllm_flash_attn.flash_attn_varlen_func`` and ``...flash_attn_interface.is_fa_version_supported``:
  vLLM's bundled FlashAttention, which vllm-omni's CUDA attention path calls; here an installed FA3
  build (found by magi2-backend-cuda-fa3's loader), version 3 only. On the CPU vllm-omni never calls it.
- ``vllm_omni`` (a package shell): its ``__init__`` imports vLLM's engine (``patch``, ``config``);
  its submodules are the wheel's files.
- ``vllm_omni.platforms.current_omni_platform``: vLLM's platform detection; :class:`Platform` says
  CUDA when torch sees a GPU, otherwise no platform (vllm-omni then takes its native torch paths), and
  gives that device's streams and events.
- ``vllm_omni.diffusion.attention.layer.Attention``: the shared attention layer needs vLLM's config
  and forward context; :class:`Attention` keeps the one path MAGI-2 uses, the model's own
  ``custom_attention`` kernel, held as ``.attention`` and called with the layer's arguments.
- ``vllm_omni.diffusion.hooks`` (a package shell with ``HookRegistry`` and ``ModelHook``): its
  ``__init__`` imports the sequence-parallel hooks, which need vLLM's distributed state; both names
  are re-exported from the wheel's own ``hooks/base.py``.
- ``vllm_omni.diffusion.offloader`` (a package shell): its ``__init__`` imports every offload backend,
  the distributed one needing vLLM's distributed state; ``layerwise_backend`` and the modules it
  imports are the wheel's.
- ``vllm_omni.diffusion.data`` (``OmniDiffusionConfig``, ``validate_dlo_host_registration_options``):
  it imports vLLM's config system and diffusers; the offloader's ``base.py`` imports these two names
  for ``OffloadConfig.from_od_config`` alone, which nothing here calls: both raise if used.

No third-party package beyond torch and Triton is needed by the modules imported here.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import logging
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch
from torch import nn

__all__ = [
    "DISTRIBUTION",
    "VERSION",
    "Attention",
    "DeviceCapability",
    "Platform",
    "download",
    "install",
    "installed",
    "installed_root",
    "unpack",
    "uninstall",
]

DISTRIBUTION = "vllm-omni"
VERSION = "0.30.0"
WHEEL = f"vllm_omni-{VERSION}-py3-none-any.whl"

_state: dict[str, Path] = {}  # the root installed now, under the names it stands in for


# ---------------------------------------------------------------------------------------------
# the wheel
# ---------------------------------------------------------------------------------------------
def download(into: Path) -> Path:
    """``pip download --no-deps vllm-omni==VERSION`` into ``into`` (about 8 MB); the wheel's path.

    Raises ``RuntimeError`` with pip's own message when the download fails (offline, no index).
    """
    into.mkdir(parents=True, exist_ok=True)
    wheel = into / WHEEL
    if wheel.is_file():
        return wheel
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--dest",
        str(into),
        f"{DISTRIBUTION}=={VERSION}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not wheel.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"`{' '.join(cmd[2:])}` failed (exit {done.returncode}): {' | '.join(tail)}")
    return wheel


def unpack(source: Path, cache: Path) -> Path:
    """The directory to import vllm-omni from: ``source`` itself when it holds ``vllm_omni/``, else the
    wheel ``source`` unpacked under ``cache`` (once; an interrupted unpack is redone)."""
    if (source / "vllm_omni").is_dir():
        return source
    if not zipfile.is_zipfile(source):
        raise ValueError(f"{source} is neither a wheel nor a directory holding an unpacked vllm_omni/ package")
    root = cache / source.stem
    done = root / ".unpacked"
    if not done.is_file():
        shutil.rmtree(root, ignore_errors=True)
        with zipfile.ZipFile(source) as wheel:
            wheel.extractall(root)
        done.touch()
    return root


# ---------------------------------------------------------------------------------------------
# the stubs
# ---------------------------------------------------------------------------------------------
class DeviceCapability(NamedTuple):
    major: int
    minor: int


class _HostEvent:
    """An event on the CPU, where every copy has finished when it returns (torch has no CPU events)."""

    def record(self, stream: object = None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class Platform:
    """``vllm_omni.platforms.current_omni_platform`` for a machine without vLLM: CUDA when torch sees a
    GPU, otherwise none of vLLM's platforms (the CPU), with that device's streams and events."""

    def is_cuda(self) -> bool:
        return torch.cuda.is_available()

    def is_rocm(self) -> bool:
        return False

    def is_npu(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_musa(self) -> bool:
        return False

    def get_device_count(self) -> int:
        return torch.cuda.device_count() if self.is_cuda() else 0

    def get_device_capability(self) -> DeviceCapability | None:
        return DeviceCapability(*torch.cuda.get_device_capability()) if self.is_cuda() else None

    def Stream(self) -> Any:  # vllm-omni's spelling: a class-like attribute
        return torch.cuda.Stream() if self.is_cuda() else torch.cpu.Stream()

    def Event(self) -> Any:
        return torch.cuda.Event() if self.is_cuda() else _HostEvent()

    def current_stream(self) -> Any:
        return torch.cuda.current_stream() if self.is_cuda() else torch.cpu.current_stream()

    def stream(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(stream) if self.is_cuda() else torch.cpu.stream(stream)


class Attention(nn.Module):
    """vllm-omni's shared ``Attention`` layer, reduced to the path MAGI-2 takes: a model-owned
    ``custom_attention`` kernel that does its own sequence-parallel exchange (vllm-omni refuses it
    otherwise) and is called with the layer's arguments unchanged."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        causal: bool,
        softmax_scale: float,
        num_kv_heads: int | None = None,
        *,
        skip_sequence_parallel: bool = False,
        custom_attention: nn.Module | None = None,
        **_options: Any,
    ) -> None:
        super().__init__()
        if custom_attention is None or not skip_sequence_parallel:
            raise NotImplementedError(
                "this stand-in of vllm-omni's Attention serves only a custom_attention kernel with "
                "skip_sequence_parallel=True (MAGI-2's); the generic backends need vLLM"
            )
        self.num_heads, self.head_size, self.causal, self.softmax_scale = num_heads, head_size, causal, softmax_scale
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.attention = custom_attention

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_metadata: Any = None) -> Any:
        return self.attention(query, key, value, attn_metadata)


@functools.cache
def _fa3() -> Any:
    """The FA3 build (found once: vLLM's bundled kernel costs no lookup per call either)."""
    from magi2_backend_cuda_fa3.abi import load_fa3

    found = load_fa3()
    if found.abi is None:
        raise RuntimeError(f"no FA3 build to stand in for vLLM's bundled FlashAttention: {found.why_none()}")
    return found.abi


def _is_fa_version_supported(version: int) -> bool:
    try:
        return version == 3 and _fa3() is not None
    except (ImportError, RuntimeError):
        return False


def _flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    max_seqlen_q: int,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_k: int,
    cu_seqlens_k: torch.Tensor | None = None,
    *,
    softmax_scale: float | None = None,
    causal: bool = False,
    softcap: float = 0.0,
    deterministic: bool = False,
    return_softmax_lse: bool = False,
    fa_version: int = 3,
    **_unused: Any,  # dropout_p=0.0, window_size=None: the defaults vllm-omni passes
) -> Any:
    """vLLM's ``flash_attn_varlen_func`` on an installed FA3 build: ``out`` or ``(out, lse [H, T])``."""
    if fa_version != 3:
        raise NotImplementedError(f"only FA3 stands in for vLLM's bundled FlashAttention, not FA{fa_version}")
    abi = _fa3()
    kwargs: dict[str, Any] = {
        "q": q,
        "k": k,
        "v": v,
        "cu_seqlens_q": cu_seqlens_q,
        "cu_seqlens_k": cu_seqlens_k,
        "max_seqlen_q": max_seqlen_q,
        "max_seqlen_k": max_seqlen_k,
        "causal": causal,
    }
    if softmax_scale is not None:
        kwargs["softmax_scale"] = softmax_scale
    if softcap > 0 or "softcap" in abi.params:
        kwargs["softcap"] = float(softcap)
    if "deterministic" in abi.params:
        kwargs["deterministic"] = deterministic
    if return_softmax_lse:
        kwargs[abi.lse_flag] = True
    out = abi.varlen(**kwargs)
    if return_softmax_lse:
        return out[0], out[1]
    return out if isinstance(out, torch.Tensor) else out[0]


def _unavailable(what: str) -> Callable[..., Any]:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise NotImplementedError(f"{what} is stubbed: the real one needs vLLM")

    return refuse


def _module(name: str, path: Path | None = None, **attrs: Any) -> ModuleType:
    module = ModuleType(name)
    spec = importlib.machinery.ModuleSpec(name, None, is_package=path is not None)
    if path is not None:
        spec.submodule_search_locations = [str(path)]
        module.__path__ = [str(path)]
    module.__spec__ = spec
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def install(root: Path) -> None:
    """Make ``import vllm_omni...`` load the wheel unpacked at ``root`` (the directory holding
    ``vllm_omni/`` and, for its version, ``vllm_omni-*.dist-info/``), with vLLM stubbed.

    Refuses to shadow a real vLLM or vllm-omni already imported; :func:`uninstall` undoes it.
    """
    import triton
    import triton.language as tl

    for name in ("vllm", "vllm_omni"):
        if name in sys.modules and name not in _state:
            raise RuntimeError(f"{name} is already imported in this process; the stubs would shadow it")
    pkg = root / "vllm_omni"
    if not (pkg / "diffusion" / "models" / "magi2" / "modeling_magi2.py").is_file():
        raise FileNotFoundError(f"{root} holds no vllm_omni/diffusion/models/magi2 (not an unpacked vllm-omni)")
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    _state["vllm"] = _state["vllm_omni"] = root

    vllm = _module("vllm", Path("/nonexistent/vllm"))  # no file of vLLM's is ever found through it
    vllm.logger = _module("vllm.logger", init_logger=logging.getLogger)
    vllm.triton_utils = _module("vllm.triton_utils", HAS_TRITON=True, triton=triton, tl=tl)
    fa = _module(
        "vllm.vllm_flash_attn", Path("/nonexistent/vllm_flash_attn"), flash_attn_varlen_func=_flash_attn_varlen_func
    )
    fa.flash_attn_interface = _module(
        "vllm.vllm_flash_attn.flash_attn_interface", is_fa_version_supported=_is_fa_version_supported
    )
    vllm.vllm_flash_attn = fa

    _module("vllm_omni", pkg)
    _module("vllm_omni.platforms", pkg / "platforms", current_omni_platform=Platform())
    _module("vllm_omni.diffusion.attention.layer", Attention=Attention)
    _module("vllm_omni.diffusion.offloader", pkg / "diffusion" / "offloader")
    _module(
        "vllm_omni.diffusion.data",
        OmniDiffusionConfig=_unavailable("vllm_omni.diffusion.data.OmniDiffusionConfig"),
        validate_dlo_host_registration_options=_unavailable(
            "vllm_omni.diffusion.data.validate_dlo_host_registration_options"
        ),
    )
    hooks = _module("vllm_omni.diffusion.hooks", pkg / "diffusion" / "hooks")
    base = importlib.import_module("vllm_omni.diffusion.hooks.base")
    hooks.HookRegistry, hooks.ModelHook = base.HookRegistry, base.ModelHook


def installed_root() -> Path | None:
    """The directory :func:`install` imports vllm-omni from, or None."""
    return _state.get("vllm_omni")


def _ours(name: str) -> bool:
    return name in ("vllm", "vllm_omni") or name.startswith(("vllm.", "vllm_omni."))


def uninstall() -> None:
    """Forget every stub and every vllm-omni module imported through them; take the wheel off the path."""
    root = _state.pop("vllm_omni", None)
    _state.pop("vllm", None)
    for name in [n for n in sys.modules if _ours(n)]:
        del sys.modules[name]
    if root is not None and str(root) in sys.path:
        sys.path.remove(str(root))
    importlib.invalidate_caches()


@contextlib.contextmanager
def installed(root: Path) -> Iterator[None]:
    """:func:`install` for the duration of a ``with`` block."""
    install(root)
    try:
        yield
    finally:
        uninstall()
