"""Fakes for MATE, torchada and torch_musa, so the provider can be exercised on a CPU.

A :class:`FakeImports` meta-path finder serves prepared module objects (and refuses "missing" ones
even if something real is installed), recording the order of imports. The fake MATE entry points
carry the exact parameter lists of MATE v0.1.0, v0.1.3, v0.2.2 and of the v0.2.2
``flash_attn_interface`` wrapper, bind every call against them (an unknown keyword is a TypeError,
as with the real function) and compute sink-free attention with the exact reference.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import itertools
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pytest
import torch
from magi2_backend_musa_mate import mate_abi
from magi2_backend_reference.attention import exact_attention

from magi2_core import config
from magi2_core.model.backend_spec import BackendSpec, SinkCorrectionSpec
from magi2_core.selection.registry import get_registry

_COMMON_HEAD = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "seqused_q", "seqused_k")
_FA3_TAIL = ("q_descale", "k_descale", "v_descale", "window_size")
# Parameter names, in order, of flash_attn_varlen_func per generation (MooreThreads/mate tags).
SIGNATURES: dict[str, tuple[str, ...]] = {
    "v0.1.0": (
        *_COMMON_HEAD,
        "softmax_scale",
        "causal",
        "qv",
        *_FA3_TAIL,
        "attention_chunk",
        "softcap",
        "num_splits",
        "pack_gqa",
        "deterministic",
        "sm_margin",
        "return_attn_probs",
        "backend",
    ),
    "v0.1.3": (
        *_COMMON_HEAD,
        "softmax_scale",
        "causal",
        "qv",
        *_FA3_TAIL,
        "learnable_sink",
        "attention_chunk",
        "softcap",
        "scheduler_metadata",
        "num_splits",
        "pack_gqa",
        "deterministic",
        "sm_margin",
        "return_attn_probs",
        "return_softmax_lse",
        "backend",
        "cp_world_size",
        "cp_rank",
        "cp_tot_seqused_k",
    ),
    "v0.2.2": (
        *_COMMON_HEAD,
        "page_table",
        "softmax_scale",
        "causal",
        "qv",
        *_FA3_TAIL,
        "learnable_sink",
        "attention_chunk",
        "softcap",
        "scheduler_metadata",
        "num_splits",
        "pack_gqa",
        "deterministic",
        "sm_margin",
        "return_softmax_lse",
        "backend",
        "cp_world_size",
        "cp_rank",
        "cp_tot_seqused_k",
        "out",
    ),
    "wrapper-v0.2.2": (
        *_COMMON_HEAD,
        "page_table",
        "block_table",
        "softmax_scale",
        "causal",
        "qv",
        *_FA3_TAIL,
        "attention_chunk",
        "softcap",
        "scheduler_metadata",
        "num_splits",
        "pack_gqa",
        "deterministic",
        "sm_margin",
        "return_attn_probs",
        "return_softmax_lse",
        "sinks",
        "s_aux",
        "cp_world_size",
        "cp_rank",
        "cp_tot_seqused_k",
        "out",
    ),
}
CORE_GENERATIONS = ("v0.1.0", "v0.1.3", "v0.2.2")
LSE_FLAG = {
    "v0.1.0": "return_attn_probs",
    "v0.1.3": "return_softmax_lse",
    "v0.2.2": "return_softmax_lse",
    "wrapper-v0.2.2": "return_softmax_lse",
}
_LSE_FLAGS = ("return_attn_probs", "return_softmax_lse")
# Everything the tests touch; removed from sys.modules around each test that fakes MUSA.
FAKED = ("torchada", "torch_musa", "mate", "mate.mha_interface", "flash_attn_interface", "flash_attn_3")


def _signature(names: Sequence[str]) -> inspect.Signature:
    params = [
        inspect.Parameter(
            n,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=inspect.Parameter.empty if n in ("q", "k", "v") else None,
        )
        for n in names
    ]
    return inspect.Signature(params)


@dataclass
class FakeVarlen:
    """A fake ``flash_attn_varlen_func`` of one MATE generation.

    ``result``: None computes sink-free attention exactly (FP32, one rounding to q's dtype);
    otherwise a callable ``(kwargs) -> object`` whose value is returned as is. ``lse_layout="th"``
    returns the LSE as ``[Tq, Hq]``. ``error`` is raised instead of computing.
    """

    generation: str
    result: Callable[[dict[str, Any]], object] | None = None
    lse_layout: str = "ht"
    error: BaseException | None = None
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.__signature__ = _signature(SIGNATURES[self.generation])

    def __call__(self, *args: Any, **kwargs: Any) -> object:
        self.calls.append((args, dict(kwargs)))
        self.__signature__.bind(*args, **kwargs)  # TypeError for a keyword this generation lacks
        if self.error is not None:
            raise self.error
        if self.result is not None:
            return self.result(kwargs)
        for name in ("learnable_sink", "sinks", "s_aux"):
            assert kwargs.get(name) is None, "the adapter must never pass native sinks"
        q, k, v = kwargs["q"], kwargs["k"], kwargs["v"]
        o, lse = exact_attention(
            q,
            k,
            v,
            kwargs["cu_seqlens_q"],
            kwargs["cu_seqlens_k"],
            softmax_scale=kwargs["softmax_scale"],
            softcap=kwargs.get("softcap") or 0.0,
            sinks=None,
            sink_rescale="fp32",
            return_lse=True,
        )
        assert lse is not None
        if self.lse_layout == "th":
            lse = lse.t().contiguous()
        if any(kwargs.get(f) for f in _LSE_FLAGS):
            return o, lse
        return o

    @property
    def last_kwargs(self) -> dict[str, Any]:
        assert self.calls, "MATE was never called"
        return self.calls[-1][1]


class FakeImports(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves prepared modules by name and refuses ``missing`` ones; records each import."""

    def __init__(self) -> None:
        self.modules: dict[str, ModuleType] = {}
        self.missing: dict[str, str] = {}
        self.broken: dict[str, BaseException] = {}
        self.imported: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in self.missing:
            raise ModuleNotFoundError(self.missing[fullname], name=fullname)
        if fullname in self.modules:
            is_pkg = hasattr(self.modules[fullname], "__path__")
            return importlib.machinery.ModuleSpec(fullname, self, is_package=is_pkg)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.modules[spec.name]

    def exec_module(self, module: ModuleType) -> None:
        self.imported.append(module.__name__)
        if module.__name__ in self.broken:
            raise self.broken[module.__name__]


@dataclass
class MusaWorld:
    """Controls what "this machine" looks like to the provider."""

    finder: FakeImports
    monkeypatch: pytest.MonkeyPatch

    def platform(self, musa: bool) -> None:
        """``musa=True``: torch.version.musa is set; else it is unset and torch_musa is absent."""
        self.monkeypatch.setattr(torch.version, "musa", "4.3.6" if musa else None, raising=False)
        if not musa:
            self.finder.missing["torch_musa"] = "No module named 'torch_musa'"

    def runtime(self, *, torchada: bool = True, torch_musa: bool = True) -> None:
        for name, present in (("torchada", torchada), ("torch_musa", torch_musa)):
            if present:
                self.finder.modules[name] = ModuleType(name)
            else:
                self.finder.missing[name] = f"No module named '{name}'"

    def mate(self, fake: FakeVarlen | None, version: str = "0.2.2") -> FakeVarlen | None:
        """Install MATE's core module with ``fake`` as its entry point (None: MATE is absent)."""
        if fake is None:
            self.finder.missing["mate"] = "No module named 'mate'"
            self.finder.missing["mate.mha_interface"] = "No module named 'mate'"
            return None
        pkg = ModuleType("mate")
        pkg.__path__ = []
        pkg.__version__ = version  # type: ignore[attr-defined]
        core = ModuleType("mate.mha_interface")
        core.flash_attn_varlen_func = fake  # type: ignore[attr-defined]
        self.finder.modules["mate"] = pkg
        self.finder.modules["mate.mha_interface"] = core
        return fake

    def wrapper(self, fake: FakeVarlen | None, version: str = "0.2.2") -> None:
        """Install a ``flash_attn_interface`` module (MATE's when version is 0.x)."""
        if fake is None:
            self.finder.missing["flash_attn_interface"] = "No module named 'flash_attn_interface'"
            return
        mod = ModuleType("flash_attn_interface")
        mod.flash_attn_varlen_func = fake  # type: ignore[attr-defined]
        mod.__version__ = version  # type: ignore[attr-defined]
        self.finder.modules["flash_attn_interface"] = mod

    def musa_with(self, generation: str = "v0.2.2", **kwargs: Any) -> FakeVarlen:
        """The common case: MUSA, torchada and torch_musa present, MATE core of ``generation``."""
        self.platform(True)
        self.runtime()
        fake = FakeVarlen(generation, **kwargs)
        self.mate(fake, version=generation.lstrip("v"))
        self.wrapper(None)
        return fake


@contextmanager
def fake_world(monkeypatch: pytest.MonkeyPatch) -> Iterator[MusaWorld]:
    """Install the finder, hide any real MATE/torchada modules, reset the cached MATE binding."""
    finder = FakeImports()
    for name in FAKED:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    for var in ("MAGI2_MATE_BACKEND", "MAGI2_MATE_SINK_CORRECTION", "MAGI2_ATTENTION_PROVIDER"):
        monkeypatch.delenv(var, raising=False)
    get_registry().state()  # the backend's settings (MAGI2_MATE_*) exist once it is loaded
    config.reload_config()
    mate_abi.load_mate_varlen.cache_clear()
    yield MusaWorld(finder, monkeypatch)
    mate_abi.load_mate_varlen.cache_clear()


@dataclass(frozen=True)
class VarlenCase:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int


def varlen_case(
    dtype: torch.dtype,
    *,
    seed: int,
    cu_q: Sequence[int] = (0, 3, 9),
    cu_k: Sequence[int] = (0, 4, 11),
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 64,
) -> VarlenCase:
    """Random packed q/k/v (fresh, never zeros) with int32 prefix sums, as the contract hands them over."""
    g = torch.Generator().manual_seed(seed)
    tq, tk = cu_q[-1], cu_k[-1]
    q = torch.randn(tq, heads, head_dim, generator=g).to(dtype)
    k = torch.randn(tk, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(tk, kv_heads, head_dim, generator=g).to(dtype)
    lq = [b - a for a, b in itertools.pairwise(cu_q)]
    lk = [b - a for a, b in itertools.pairwise(cu_k)]
    return VarlenCase(
        q, k, v, torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32), max(lq), max(lk)
    )


def triton_correction(*args: Any, **kwargs: Any) -> Any:
    """Replaced by the test that asks for it (the impl that :class:`FakeTritonSinks` names)."""
    raise AssertionError("musa_fakes.triton_correction was not replaced by the test")


class FakeTritonSinks:
    """A backend contributing a sink correction named ``triton`` whose kernel is :func:`triton_correction`."""

    def magi2_backend(self) -> BackendSpec:
        return BackendSpec(
            name="fake-triton-sinks",
            version="0",
            core_api=">=2.0,<3",
            providers=(),
            sink_corrections=(
                SinkCorrectionSpec(
                    name="triton", impl="musa_fakes:triton_correction", device_types=("cuda",), priority=10
                ),
            ),
        )
