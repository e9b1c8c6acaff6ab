"""The MATE ABI adapter: find MATE's varlen entry point, learn what it accepts, call it by keyword.

MATE's ``flash_attn_varlen_func`` changed between releases (docs/musa.md):

* v0.1.0 asks for the LSE with ``return_attn_probs`` only;
* v0.1.3 accepts ``return_attn_probs`` and ``return_softmax_lse``;
* v0.2.x accepts ``return_softmax_lse`` only, and inserted ``page_table`` positionally;
* the FA3-compatible wrapper (distribution ``flash_attn_3``, module ``flash_attn_interface``)
  accepts both flags and has no ``backend`` selector.

So the call is built from the function's signature, every argument goes by keyword (positions
differ between generations), and the LSE comes back normalised to the contract's ``[Hq, Tq]``.
Sinks are never passed to MATE: the provider applies them afterwards in FP32.

Two facts of MATE's ``backend="auto"`` (read in MATE's ``mate/mha_interface.py``) decide when the
adapter picks a backend itself:

* ``auto`` uses the prebuilt ``mubin`` kernel when its input check passes, and that kernel has no
  softcap argument. The check only excludes ``softcap != 0`` from v0.2.1 on; in v0.1.0–v0.2.0 a
  capped call could silently run uncapped. With a positive softcap the adapter therefore asks for
  ``mutlass`` (which ``auto`` picks anyway from v0.2.1), and refuses the wrapper (which cannot be
  told) unless MATE is at least v0.2.1.
* Otherwise MATE's default stays in charge; ``MAGI2_MATE_BACKEND=auto|mutlass|mubin`` overrides it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from packaging.version import InvalidVersion, Version

from magi2_backend_musa_mate.platform import import_musa_runtime, musa_installed
from magi2_backend_musa_mate.settings import MATE_BACKEND
from magi2_core.backend import config

if TYPE_CHECKING:
    from magi2_core.backend import AttentionCall

__all__ = [
    "BACKENDS",
    "BACKEND_ENV",
    "INTERFACES",
    "SINK_KEYWORDS",
    "MateVarlen",
    "load_mate_varlen",
    "normalise_lse",
    "requested_backend",
]

BACKEND_ENV = MATE_BACKEND.name
BACKENDS = MATE_BACKEND.choices
# Where MATE's varlen entry point lives, in order of preference: the core module first, because
# three different distributions ship a module named ``flash_attn_interface`` (upstream FA3 on CUDA,
# tokenspeed-fa3, MATE's wrapper) and the name alone does not say which one is installed.
INTERFACES: tuple[tuple[str, str], ...] = (
    ("mate.mha_interface", "flash_attn_varlen_func"),
    ("flash_attn_interface", "flash_attn_varlen_func"),
)
# MATE's native sink keywords (core, wrapper, wrapper alias); the adapter never sends any of them.
SINK_KEYWORDS = ("learnable_sink", "sinks", "s_aux")
# Newest LSE keyword first: v0.1.3 and the wrapper take either; v0.1.0 only the second.
_LSE_FLAGS = ("return_softmax_lse", "return_attn_probs")
# First MATE release whose ``auto`` keeps a softcapped call off the softcap-less mubin kernel.
_AUTO_HONOURS_SOFTCAP = Version("0.2.1")


def requested_backend() -> str | None:
    """The user's ``MAGI2_MATE_BACKEND`` (None when unset or empty), validated by magi2_core.config."""
    value: str | None = config.get(BACKEND_ENV)
    return value


def normalise_lse(lse: object, heads: int, tokens: int) -> torch.Tensor:
    """Return MATE's varlen LSE as the contract's FP32 ``[heads, tokens]``.

    Some MATE builds return the packed ``[tokens, heads]`` layout; that is transposed. A square
    result (``heads == tokens``) cannot be told apart and is kept as ``[heads, tokens]``, as
    upstream does. Anything else is a provider bug and raises :class:`RuntimeError`.
    """
    if not isinstance(lse, torch.Tensor):
        raise RuntimeError(f"MATE returned a non-tensor LSE ({type(lse).__name__})")
    shape = tuple(lse.shape)
    if shape == (heads, tokens):
        out = lse
    elif shape == (tokens, heads):
        out = lse.t().contiguous()
    else:
        raise RuntimeError(
            f"MATE returned an LSE of shape {list(shape)}; expected [{heads}, {tokens}] (or [{tokens}, {heads}])"
        )
    if out.dtype != torch.float32:
        raise RuntimeError(f"MATE returned a {out.dtype} LSE; the contract (and the sink correction) needs FP32")
    return out


def _version_at_least(version: str, minimum: Version) -> bool:
    try:
        return Version(version) >= minimum
    except InvalidVersion:
        return False


@dataclass(frozen=True)
class MateVarlen:
    """MATE's ``flash_attn_varlen_func`` as found, with what its signature accepts."""

    fn: Callable[..., object]
    source: str
    version: str
    params: frozenset[str]
    accepts_any: bool = False

    @classmethod
    def bind(cls, fn: Callable[..., object], source: str, version: str) -> MateVarlen:
        """Read ``fn``'s signature (through ``functools.wraps`` layers such as ``@mate_api``)."""
        sig = inspect.signature(fn)
        named = frozenset(n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
        return cls(fn, source, version, named, var_kw)

    def accepts(self, name: str) -> bool:
        return self.accepts_any or name in self.params

    @property
    def lse_flag(self) -> str | None:
        """The keyword that makes this generation return ``(out, lse)``."""
        return next((f for f in _LSE_FLAGS if self.accepts(f)), None)

    def backend_for(self, softcap: float, override: str | None) -> str | None:
        """The ``backend=`` to send: the user's choice, else ``mutlass`` for a softcap, else none."""
        if override is not None:
            return override
        if softcap > 0 and self.accepts("backend"):
            return "mutlass"
        return None

    def unsupported(self, *, softcap: bool, lse: bool, deterministic: bool, override: str | None) -> list[str]:
        """Why this entry point cannot serve such a call (empty: it can). Depends on no sizes."""
        why: list[str] = []
        if override is not None and override not in BACKENDS:
            why.append(f"{BACKEND_ENV}={override!r} is not one of {', '.join(BACKENDS)}")
        if override is not None and not self.accepts("backend"):
            why.append(
                f"{BACKEND_ENV}={override!r} is set but {self.source}.flash_attn_varlen_func has no "
                f"'backend' parameter; unset it or install MATE's core module"
            )
        if lse and self.lse_flag is None:
            why.append(
                f"{self.source}.flash_attn_varlen_func has neither {' nor '.join(_LSE_FLAGS)}: "
                f"no LSE, so no sinks and no return_lse"
            )
        if softcap and override == "mubin":
            why.append(f"softcap requested but {BACKEND_ENV}=mubin: MATE's mubin kernel has no softcap")
        if softcap and not self.accepts("backend") and not _version_at_least(self.version, _AUTO_HONOURS_SOFTCAP):
            why.append(
                f"softcap requested through {self.source} (MATE {self.version}), which cannot select "
                f"'mutlass'; MATE < {_AUTO_HONOURS_SOFTCAP} 'auto' may run the softcap-less mubin kernel"
            )
        if softcap and not self.accepts("softcap"):
            why.append(f"{self.source}.flash_attn_varlen_func has no 'softcap' parameter")
        if deterministic and not self.accepts("deterministic"):
            why.append(f"{self.source}.flash_attn_varlen_func has no 'deterministic' parameter")
        return why

    def __call__(
        self, call: AttentionCall, *, return_lse: bool, backend: str | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Non-causal varlen attention of ``call`` without its sinks: ``(o [Tq, Hq, Dv], lse [Hq, Tq] FP32 or
        None)``. ``return_lse`` may ask for more than ``call.return_lse`` (the sinks need the LSE);
        ``backend`` is ``MAGI2_MATE_BACKEND``'s choice.

        Exceptions raised by MATE propagate unchanged; a malformed result raises RuntimeError.
        """
        q, deterministic = call.q, call.deterministic
        cap = max(float(call.softcap), 0.0)  # MATE caps at |c| for a negative c; <= 0 means "off" here
        why = self.unsupported(softcap=cap > 0, lse=return_lse, deterministic=deterministic, override=backend)
        if why:
            raise NotImplementedError("; ".join(why))
        kwargs: dict[str, object] = {
            "q": q,
            "k": call.k,
            "v": call.v,
            "cu_seqlens_q": call.cu_seqlens_q,
            "cu_seqlens_k": call.cu_seqlens_k,
            "max_seqlen_q": int(call.max_seqlen_q),
            "max_seqlen_k": int(call.max_seqlen_k),
            "softmax_scale": float(call.softmax_scale),
            "causal": False,
            "softcap": cap,
        }
        if self.accepts("deterministic"):
            kwargs["deterministic"] = bool(deterministic)
        chosen = self.backend_for(cap, backend)
        if chosen is not None:
            kwargs["backend"] = chosen
        if return_lse:
            flag = self.lse_flag
            assert flag is not None  # unsupported() above
            kwargs[flag] = True
        result = self.fn(**kwargs)
        return self._split(result, q, call.v, return_lse)

    def _split(
        self, result: object, q: torch.Tensor, v: torch.Tensor, return_lse: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if return_lse:
            if not isinstance(result, (tuple, list)) or len(result) < 2:
                raise RuntimeError(
                    f"{self.source}.flash_attn_varlen_func was asked for the LSE but returned "
                    f"{type(result).__name__}, not (out, lse)"
                )
            out, lse = result[0], normalise_lse(result[1], q.shape[1], q.shape[0])
        else:
            out = result[0] if isinstance(result, (tuple, list)) else result
            lse = None
        expected = (q.shape[0], q.shape[1], v.shape[2])
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
            got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise RuntimeError(f"MATE returned an output of {got}; expected {list(expected)}")
        return out, lse


def _mate_version() -> str:
    mate = sys.modules.get("mate")
    version = getattr(mate, "__version__", None)
    return str(version) if version else "unknown"


def _wrapper_version(module: object) -> str | None:
    """MATE's version if ``module`` is MATE's ``flash_attn_interface`` wrapper, else None.

    MATE versions its wrapper like itself (0.x); upstream FlashAttention-3 is 3.x.
    """
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            version = importlib.metadata.version("flash_attn_3")
        except importlib.metadata.PackageNotFoundError:
            return None
    try:
        return str(version) if Version(str(version)).major < 3 else None
    except InvalidVersion:
        return None


@functools.cache
def load_mate_varlen() -> MateVarlen | str:
    """Bring up the MUSA runtime (torchada first), then find MATE's entry point; once per process.

    Returns the bound entry point, or a sentence saying why MATE is unavailable (not MUSA, an
    ImportError of torchada, torch_musa or MATE). Any other exception while importing propagates:
    a broken installation is an error, not an absence.
    """
    if not musa_installed():
        return "not a MUSA platform: torch.version.musa is unset and torch_musa is not installed"
    try:
        import_musa_runtime()
    except ImportError as exc:
        return f"the MUSA runtime does not import ({type(exc).__name__}: {exc}); install torch_musa and torchada"
    tried: list[str] = []
    for module_name, attr in INTERFACES:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            tried.append(f"{module_name}: {type(exc).__name__}: {exc}")
            continue
        fn = getattr(module, attr, None)
        if not callable(fn):
            tried.append(f"{module_name} has no {attr}")
            continue
        if module_name == "mate.mha_interface":
            return MateVarlen.bind(fn, module_name, _mate_version())
        version = _wrapper_version(module)
        if version is None:
            tried.append(f"{module_name} is not MATE's wrapper (upstream FlashAttention-3 or unknown version)")
            continue
        return MateVarlen.bind(fn, module_name, version)
    return "MATE is not importable (" + "; ".join(tried) + "); build it from source, see docs/musa.md"
