"""The vLLM general plugin: route vllm-omni's MAGI-2 operators to magi2-core.

vllm-omni 0.30 offers no hook for swapping MAGI-2's layer classes, so the plugin replaces three
module attributes and six methods, chosen where vllm-omni looks them up when the model is BUILT or
CALLED (a name that was bound at import time elsewhere would not see a patch):

- ``modeling_magi2.Magi2MultiHeadMoE``: read when each MoE layer is constructed and by
  ``load_weights``' isinstance checks (``modeling_magi2`` imported the class by name, so patching
  ``mh_moe`` would change nothing). Those checks must keep finding the MoE layers of a model built
  before the swap (vllm-omni's own), so while swapped, vllm-omni's class counts as ours in them;
- ``modeling_magi2.MultiModalityRMSNorm``: read when every norm of the model is constructed;
- ``attention.packed_attention_with_sink``: read on every call by the Ulysses attention wrapper,
  after its own head exchange;
- ``modeling_magi2.Magi2TransformerLayer``'s ``_branch_logits``, ``_branch_input`` and ``_connect``
  (the mHC of each branch): methods, read on every call, so layers built before the swap use them too;
- ``modeling_magi2.Magi2Attention.project`` (the q/k norm, ``inverse_permute``, RoPE and cast of each
  attention's input) and ``Magi2Attention.output`` (the ``permute`` gather, sigmoid gate and cast of
  its output): methods, likewise;
- ``modeling_magi2.Magi2MultiHeadMoELayer._shared_experts``: the same math without the concatenation
  around SwiGLU7 (no operator: a layer-level change, see ``shared_experts``), a method likewise.

The model module is not imported here: vLLM runs general plugins in every process, most of which
never build MAGI-2. An import hook applies the patch when ``modeling_magi2`` is first imported (or
at once if it already is), so it is in place before any model is constructed. Each swap is guarded:
the installed vllm-omni must be a version this adapter was written against, and each attribute must
still be vllm-omni's own with the call signature read from 0.30.0; otherwise the operator is left
alone and a WARNING says why.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from magi2_core import config as m2_config
from magi2_core.errors import ResolutionError
from magi2_core.integrations.vllm_omni.attention import packed_attention_with_sink
from magi2_core.integrations.vllm_omni.gate import METHODS as GATE_METHODS
from magi2_core.integrations.vllm_omni.gate import AttentionOutputMethods
from magi2_core.integrations.vllm_omni.mhc import METHODS, MHCLayerMethods
from magi2_core.integrations.vllm_omni.moe import Magi2MultiHeadMoE
from magi2_core.integrations.vllm_omni.norm import MultiModalityRMSNorm
from magi2_core.integrations.vllm_omni.qk_rope import METHODS as QK_ROPE_METHODS
from magi2_core.integrations.vllm_omni.qk_rope import AttentionProjectMethods
from magi2_core.integrations.vllm_omni.settings import (
    PLUGIN_LOAD,
    VLLM_OMNI,
    VLLM_OMNI_MHC,
    VLLM_OMNI_OUTPUT_GATE,
    VLLM_OMNI_QK_ROPE,
    VLLM_OMNI_SHARED_EXPERTS,
)
from magi2_core.integrations.vllm_omni.shared_experts import METHODS as SHARED_EXPERTS_METHODS
from magi2_core.integrations.vllm_omni.shared_experts import SharedExpertsMethods
from magi2_core.model import devices
from magi2_core.model.problem import Feature, Problem
from magi2_core.selection.resolver import resolve_problem

__all__ = ["SUPPORTED_VERSIONS", "register", "unregister"]

logger = logging.getLogger(__name__)

DISTRIBUTION = "vllm-omni"
SUPPORTED_VERSIONS = SpecifierSet(">=0.30.0,<0.31")
_PKG = "vllm_omni.diffusion.models.magi2"
_MODELING = f"{_PKG}.modeling_magi2"
# A typical per-GPU call, for the log line only (every real call resolves by its own shape).
_TYPICAL_TOKENS = 14601


@dataclass(frozen=True)
class _Swap:
    op: str  # what the log lines name: the operator it routes to (or, for ``no_operator``, the change)
    module: str  # where the attribute is looked up at build/call time
    attr: str
    origin: str  # the upstream module that defines the original
    replacement: Callable[..., Any]
    # isinstance(obj, replacement) also holds for the original's instances (see Magi2MultiHeadMoE)
    stands_in: bool = False
    # When set, ``attr`` names a class whose methods of these names are replaced by ``replacement``'s
    methods: tuple[str, ...] = ()
    # When set, this setting (read at plugin load) decides the swap: off, on, or auto (see _GAINS_NOTHING)
    enabled_by: str | None = None
    # When set, the swap calls no operator (torch code rearranged, the same result everywhere): what the
    # log line says in place of the providers a typical call resolves to
    no_operator: str | None = None


_SWAPS: tuple[_Swap, ...] = (
    _Swap(
        "attention", f"{_PKG}.attention", "packed_attention_with_sink", f"{_PKG}.attention", packed_attention_with_sink
    ),
    _Swap("moe", _MODELING, "Magi2MultiHeadMoE", f"{_PKG}.mh_moe", Magi2MultiHeadMoE, stands_in=True),
    _Swap("rmsnorm", _MODELING, "MultiModalityRMSNorm", f"{_PKG}.layers", MultiModalityRMSNorm),
    _Swap(
        "mhc",
        _MODELING,
        "Magi2TransformerLayer",
        _MODELING,
        MHCLayerMethods,
        methods=METHODS,
        enabled_by=VLLM_OMNI_MHC.name,
    ),
    _Swap(
        "qk_norm_rope",
        _MODELING,
        "Magi2Attention",
        _MODELING,
        AttentionProjectMethods,
        methods=QK_ROPE_METHODS,
        enabled_by=VLLM_OMNI_QK_ROPE.name,
    ),
    _Swap(
        "output_gate",
        _MODELING,
        "Magi2Attention",
        _MODELING,
        AttentionOutputMethods,
        methods=GATE_METHODS,
        enabled_by=VLLM_OMNI_OUTPUT_GATE.name,
    ),
    _Swap(
        "shared_experts",
        _MODELING,
        "Magi2MultiHeadMoELayer",
        _MODELING,
        SharedExpertsMethods,
        methods=SHARED_EXPERTS_METHODS,
        enabled_by=VLLM_OMNI_SHARED_EXPERTS.name,
        no_operator="vllm-omni's own GEMMs and SwiGLU7, with the activation applied to each expert's half "
        "(no concatenation, no copy; the same result bit for bit)",
    ),
)
# Providers that compute what vllm-omni's own code computes, in its form (the float64 oracle, upstream's
# torch code): an "auto" swap that would resolve only to these is left out, since it cannot be faster.
_GAINS_NOTHING = frozenset({"reference", "torch_native"})
# The originals this process replaced, per (module, attribute), so unregister() can put them back.
_ORIGINALS: dict[tuple[str, str], object] = {}


def register() -> None:
    """Entry point of ``vllm.general_plugins``; safe to call any number of times in one process.

    Silent when vllm-omni is not installed; logs (and does nothing) when ``MAGI2_VLLM_OMNI=0`` or
    the installed vllm-omni is not a supported version.
    """
    if importlib.util.find_spec("vllm_omni") is None:
        return
    _share_vllm_log_handlers()
    for setting in PLUGIN_LOAD:  # the swaps (or not) are decided now: a later change is refused, not ignored
        m2_config.fix(setting.name)
    if not m2_config.get(VLLM_OMNI.name):
        logger.info("magi2-core: MAGI2_VLLM_OMNI=0, vllm-omni's MAGI-2 operators are left as they are")
        return
    try:
        installed = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        logger.warning(
            "magi2-core: vllm_omni is importable but no %s distribution is installed, so its version cannot "
            "be checked; MAGI-2 operators are left as they are (install vllm-omni %s with pip)",
            DISTRIBUTION,
            SUPPORTED_VERSIONS,
        )
        return
    if not _supported(installed):
        logger.warning(
            "magi2-core: vllm-omni %s is installed but this adapter was written against vllm-omni %s; "
            "MAGI-2 operators are left as they are (install a matching magi2-core, or vllm-omni %s)",
            installed,
            SUPPORTED_VERSIONS,
            SUPPORTED_VERSIONS,
        )
        return
    modeling = sys.modules.get(_MODELING)
    if modeling is not None:
        _patch(modeling)
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def unregister() -> None:
    """Remove the import hook and put vllm-omni's originals back in modules already imported.

    Models built while the patch was in place keep magi2-core's layers; vllm-omni's ``load_weights``
    no longer recognises their MoE layers, so load them before unregistering.
    """
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _PatchOnImport)]
    for setting in PLUGIN_LOAD:
        m2_config.release(setting.name)
    for (module_name, attr), original in list(_ORIGINALS.items()):
        module = sys.modules.get(module_name)
        owner_name, _, method = attr.partition(".")
        if module is not None and method:  # a method of a class: put it back where ours is
            owner = getattr(module, owner_name, None)
            if owner is not None and _is_ours(owner, method):
                setattr(owner, method, original)
        elif module is not None and any(getattr(module, attr, None) is s.replacement for s in _SWAPS):
            setattr(module, attr, original)
        del _ORIGINALS[(module_name, attr)]
    for swap in _SWAPS:
        if swap.stands_in:
            swap.replacement.stands_in_for = ()  # type: ignore[attr-defined]


def _supported(installed: str) -> bool:
    try:
        return SUPPORTED_VERSIONS.contains(Version(installed), prereleases=True)
    except InvalidVersion:
        return False


def _share_vllm_log_handlers() -> None:
    """Make this plugin's INFO lines visible in a vLLM log.

    vLLM configures only its own ``vllm`` logger, so without this the ``magi2_core`` lines would
    reach no handler. Nothing changes when logging is configured anywhere up our chain.
    """
    ours, vllm_logger = logging.getLogger("magi2_core"), logging.getLogger("vllm")
    if ours.hasHandlers() or not vllm_logger.handlers:
        return
    for handler in vllm_logger.handlers:
        ours.addHandler(handler)
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.INFO)


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then applies the swaps to the freshly executed module."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ... for tracebacks and inspect
        return getattr(self._inner, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``modeling_magi2`` with the other finders and wraps its loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _MODELING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def _is_ours(owner: object, method: str) -> bool:
    return any(getattr(owner, method, None) is getattr(s.replacement, method, object()) for s in _SWAPS if s.methods)


def _patch(modeling: ModuleType) -> None:
    for swap in _SWAPS:
        mode = "on" if swap.enabled_by is None else _switch(m2_config.get(swap.enabled_by))
        if mode == "off":
            logger.info("magi2-core: vllm-omni MAGI-2 %s left as it is (%s=0)", swap.op, swap.enabled_by)
            continue
        module = modeling if swap.module == modeling.__name__ else importlib.import_module(swap.module)
        current = getattr(module, swap.attr, None)
        if current is swap.replacement or (swap.methods and _is_ours(current, swap.methods[0])):
            continue  # already swapped in this process
        problem = _guard(swap, current)
        if problem is not None:
            logger.warning("magi2-core: vllm-omni MAGI-2 %s left as it is: %s", swap.op, problem)
            continue
        try:
            served_by, chosen = (swap.no_operator, ()) if swap.no_operator else _describe_provider(swap.op, modeling)
        except ResolutionError as exc:
            logger.warning(
                "magi2-core: vllm-omni MAGI-2 %s left as it is: no provider serves it here\n%s", swap.op, exc
            )
            continue
        if mode == "auto" and chosen and set(chosen) <= _GAINS_NOTHING:
            logger.info(
                "magi2-core: vllm-omni MAGI-2 %s left as it is (%s=auto): %s, which computes vllm-omni's own form "
                "with no gain; %s=1 swaps it in anyway",
                swap.op,
                swap.enabled_by,
                served_by,
                swap.enabled_by,
            )
            continue
        if swap.methods:
            for method in swap.methods:
                _ORIGINALS[(swap.module, f"{swap.attr}.{method}")] = getattr(current, method)
                setattr(current, method, getattr(swap.replacement, method))
        else:
            _ORIGINALS[(swap.module, swap.attr)] = current
            if swap.stands_in:
                swap.replacement.stands_in_for = (current,)  # type: ignore[attr-defined]
            setattr(module, swap.attr, swap.replacement)
        logger.info(
            "magi2-core: vllm-omni MAGI-2 %s (%s.%s%s) now runs on magi2-core; %s",
            swap.op,
            swap.module.rsplit(".", 1)[1],
            swap.attr,
            "." + "/".join(swap.methods) if swap.methods else "",
            served_by,
        )


def _guard(swap: _Swap, current: object) -> str | None:
    """Why ``current`` must not be replaced, or None when it is vllm-omni's own, as read in 0.30.0."""
    origin = sys.modules.get(swap.origin)
    original = getattr(origin, swap.attr, None) if origin is not None else None
    if current is None or current is not original:
        return (
            f"{swap.module}.{swap.attr} is {current!r}, not vllm-omni's own {swap.origin}.{swap.attr} "
            f"(another plugin replaced it, or vllm-omni changed)"
        )
    pairs: list[tuple[str, Callable[..., Any], Callable[..., Any]]]
    if swap.methods:
        for method in swap.methods:
            theirs = getattr(current, method, None)
            if getattr(theirs, "__qualname__", None) != f"{swap.attr}.{method}" or theirs.__module__ != swap.origin:
                return (
                    f"{swap.attr}.{method} is {theirs!r}, not vllm-omni's own (another plugin replaced it, "
                    "or vllm-omni changed)"
                )
        pairs = [(f"{swap.attr}.{m}", getattr(current, m), getattr(swap.replacement, m)) for m in swap.methods]
    elif inspect.isclass(current):
        pairs = [
            (f"{swap.attr}.{m}", getattr(current, m), getattr(swap.replacement, m)) for m in ("__init__", "forward")
        ]
    else:
        pairs = [(swap.attr, current, swap.replacement)]  # type: ignore[list-item]
    for name, theirs, ours in pairs:
        mismatch = _signature_mismatch(theirs, ours)
        if mismatch is not None:
            return f"{name} has a call signature this adapter does not accept ({mismatch})"
    return None


def _signature_mismatch(theirs: Callable[..., Any], ours: Callable[..., Any]) -> str | None:
    """Every parameter of upstream's must exist in ours with the same kind; our extras need defaults."""
    up, mine = inspect.signature(theirs).parameters, inspect.signature(ours).parameters
    for name, param in up.items():
        if name not in mine or mine[name].kind != param.kind:
            return f"upstream parameter {param} has no counterpart"
    extra = [str(p) for n, p in mine.items() if n not in up and p.default is inspect.Parameter.empty]
    return f"required parameters {extra} that upstream never passes" if extra else None


def _device_type() -> str:
    if devices.cuda_available():
        return "cuda"
    if devices.musa_installed() and devices.musa_available():
        return "musa"
    return "cpu"


def _switch(value: object) -> str:
    """``on``, ``off`` or ``auto`` for a value of a swap's setting (a boolean, or one of its choices)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "off" if value in m2_config.FALSE_WORDS else "on" if value in m2_config.TRUE_WORDS else "auto"


def _describe_provider(op: str, modeling: ModuleType) -> tuple[str, tuple[str | None, ...]]:
    """Which providers a typical call of ``op`` resolves to on this machine (no tensor, no kernel): a
    sentence for the log, and their names."""
    cfg = modeling.Magi2PreviewConfig()
    dev, t = _device_type(), _TYPICAL_TOKENS
    if op == "attention":
        problem = Problem(
            op="attention",
            device_type=dev,
            dtype="bfloat16",
            features=frozenset({Feature.SINKS}),
            tokens=t,
            tokens_k=t,
            max_seqlen_q=t,
            max_seqlen_k=t,
            num_segments=1,
            head_dim=cfg.head_dim,
            num_heads_q=cfg.num_heads_q,
            num_heads_kv=cfg.num_heads_kv,
        )
        chosen = resolve_problem(problem).chosen
        return (
            f"a typical call ({dev}, bfloat16, {t} tokens, {cfg.num_heads_q}x{cfg.head_dim} heads, sinks) "
            f"resolves to provider {chosen!r} (`magi2 explain attention --device {dev} --sinks "
            f"--max-seqlen-q {t} --heads-q {cfg.num_heads_q}` shows why)"
        ), (chosen,)
    if op == "moe":
        moe = cfg.moe
        dims = dict(
            tokens=t,
            num_heads=moe.num_heads,
            num_experts=moe.num_experts,
            top_k=moe.top_k,
            hidden=cfg.hidden_size // moe.num_heads,
        )
        route = resolve_problem(Problem(op="moe_route", device_type=dev, dtype="bfloat16", **dims)).chosen
        experts = resolve_problem(
            Problem(
                op="moe_experts", device_type=dev, dtype="bfloat16", intermediate=moe.expert_intermediate_size, **dims
            )
        ).chosen
        return (
            f"a typical call ({dev}, bfloat16, {t} tokens, {moe.num_heads} heads x {moe.num_experts} experts) "
            f"resolves routing to provider {route!r} and experts to {experts!r} "
            f"(`magi2 explain moe_experts --device {dev} --moe-heads {moe.num_heads} --tokens {t}` shows why)"
        ), (route, experts)
    if op == "mhc":
        streams, hidden = cfg.mhc.num_streams, cfg.hidden_size
        sizes = dict(tokens=t, num_streams=streams, hidden=hidden)
        pre = resolve_problem(
            Problem(op="mhc_pre", device_type=dev, dtype="bfloat16", out_dtype="bfloat16", num_modalities=3, **sizes)
        ).chosen
        mix = resolve_problem(Problem(op="mhc_mix", device_type=dev, dtype="bfloat16", **sizes)).chosen
        return (
            f"a typical call ({dev}, bfloat16, {t} tokens x {streams} streams x {hidden}, 3 modalities) resolves "
            f"mhc_pre to provider {pre!r} and mhc_mix to {mix!r} "
            f"(`magi2 explain mhc_pre --device {dev} --modalities 3 --tokens {t}` shows why)"
        ), (pre, mix)
    if op == "qk_norm_rope":
        heads, head_dim = cfg.num_heads_q, cfg.head_dim
        rotary = 6 * (head_dim // 8)  # ElementWiseFourierEmbed: sin and cos of 3 coordinates x head_dim/8 bands
        chosen = resolve_problem(
            Problem(
                op="qk_norm_rope",
                device_type=dev,
                dtype="bfloat16",
                out_dtype="bfloat16",
                tokens=t,
                num_heads=heads,
                head_dim=head_dim,
                rotary_dim=rotary,
                num_modalities=3,
            )
        ).chosen
        return (
            f"a typical call ({dev}, bfloat16, {t} tokens x {heads} heads of {head_dim}, {rotary} rotated, "
            f"3 modalities) resolves to provider {chosen!r} (`magi2 explain qk_norm_rope --device {dev} "
            f"--modalities 3 --tokens {t}` shows why)"
        ), (chosen,)
    if op == "output_gate":
        heads, head_dim = cfg.num_heads_q, cfg.head_dim
        chosen = resolve_problem(
            Problem(
                op="output_gate",
                device_type=dev,
                dtype="bfloat16",
                out_dtype="bfloat16",
                tokens=t,
                num_heads=heads,
                head_dim=head_dim,
            )
        ).chosen
        return (
            f"a typical call ({dev}, bfloat16, {t} tokens x {heads} heads of {head_dim}) resolves to provider "
            f"{chosen!r} (`magi2 explain output_gate --device {dev} --tokens {t}` shows why)"
        ), (chosen,)
    problem = Problem(
        op="rmsnorm",
        device_type=dev,
        dtype="bfloat16",
        out_dtype="bfloat16",
        tokens=t,
        width=cfg.hidden_size,
        num_modalities=3,
        num_patterns=1,
    )
    chosen = resolve_problem(problem).chosen
    return (
        f"a typical call ({dev}, bfloat16, {t} x {cfg.hidden_size}, 3 modalities) resolves to provider "
        f"{chosen!r} (`magi2 explain rmsnorm --device {dev} --modalities 3 --tokens {t}` shows why)"
    ), (chosen,)
