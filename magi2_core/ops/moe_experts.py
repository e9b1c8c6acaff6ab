"""The ``moe_experts`` operator: MAGI-2's routed BF16 experts with SwiGLU7, and its weight preparation.

Experts: ``w_gate``/``w_up`` ``[Hl·E, d, I]``, ``w_down`` ``[Hl·E, I, d]``; probs FP32 ``[Hl, T, K]``,
idx ``[Hl, T, K]`` per-head expert ids in ``[0, E)``. :func:`prepare_moe_weights` lays one layer's
weights out once, at load time, for the provider that serves them (see :mod:`magi2_core.contracts.moe_weights`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import torch

from magi2_core import config
from magi2_core.contracts import _checks as checks
from magi2_core.contracts import acceptance as acc
from magi2_core.contracts.moe_weights import CHECKPOINT, PreparedMoEWeights, check_weights, checkpoint_views
from magi2_core.errors import InvalidDTypeError, InvalidShapeError, InvalidValueError
from magi2_core.model.problem import Problem
from magi2_core.ops._args import TENSOR, Arg, Args, Pack, deterministic_arg, record
from magi2_core.ops._compiled import custom_op, fake_like
from magi2_core.ops._lookup import cache_lookup
from magi2_core.ops._spec import OpSpec, forward_only
from magi2_core.selection import shadow as _shadow
from magi2_core.selection.registry import get_registry
from magi2_core.selection.resolver import resolve_problem

__all__ = [
    "ARGS",
    "SPEC",
    "ExpertsCall",
    "ExpertsKey",
    "MoEExpertsKernel",
    "MoEWeightPreparer",
    "moe_experts",
    "prepare_moe_weights",
    "validate",
]

OP: Literal["moe_experts"] = "moe_experts"


class ExpertsKey(NamedTuple):
    """The typed problem of an experts call: what provider selection may depend on."""

    device: torch.device | str
    dtype: str
    out_dtype: None
    features: int
    tokens: int
    num_heads: int
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int


class ExpertsCall(NamedTuple):
    """One validated experts call: what a provider receives, whole and frozen (the core API 2 ABI).

    The weights are checkpoint-layout views (of prepared tensors, when the caller prepared them:
    :class:`MoEWeightPreparer`). ``deterministic=True`` reaches only providers that declare the
    ``deterministic`` feature; their output must then be bitwise repeatable. The tensors come first:
    a repeated layout reuses the rest.
    """

    x: torch.Tensor
    probs: torch.Tensor
    idx: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor
    deterministic: bool
    key: ExpertsKey


def _weights_arg(w_gate: object, w_up: object, w_down: object) -> tuple[str, tuple[torch.Tensor, ...]]:
    """The weights as (layout, tensors): what the custom op can carry through a compiled graph."""
    if isinstance(w_gate, PreparedMoEWeights):
        if w_up is not None or w_down is not None:
            raise InvalidValueError(OP, "w_up/w_down", "omitted when w_gate is a PreparedMoEWeights", "tensors")
        return w_gate.layout, w_gate.tensors
    return CHECKPOINT, (w_gate, w_up, w_down)  # type: ignore[return-value]  # validated below


def _pack(w_gate: object, w_up: object, w_down: object) -> tuple[list[torch.Tensor], str]:
    layout, tensors = _weights_arg(w_gate, w_up, w_down)
    return list(tensors), layout


def _unpack(weights: list[torch.Tensor], layout: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return checkpoint_views(layout, tuple(weights))


# The arguments of :func:`moe_experts` (without ``provider``), declared once: see :mod:`magi2_core.ops._args`.
# The three weights (or one PreparedMoEWeights in w_gate's place) reach the custom op as a tensor list and
# its layout name; validation receives their checkpoint-layout views.
ARGS = Args(
    OP,
    (
        Arg(
            "x",
            "torch.Tensor",
            "``[T, Hl, d]``, BF16, FP16 or FP32 (BF16 in MAGI-2), as routed.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "probs",
            "torch.Tensor",
            "``[Hl, T, K]`` FP32, head-major, as :func:`moe_route` returns it.",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "idx",
            "torch.Tensor",
            "``[Hl, T, K]`` int64 or int32, expert ids within each head in ``[0, E)``, as "
            ":func:`moe_route` returns it; on an accelerator, range-checked only with ``MAGI2_CHECK_DEVICE_VALUES=1`` "
            "(an id out of range is undefined behaviour otherwise).",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg(
            "w_gate",
            "torch.Tensor | PreparedMoEWeights",
            "``[Hl·E, d, I]``, x's dtype and device, head-major (rows "
            "``h·E .. h·E+E-1`` are head h's experts). Or, in ``w_gate``'s place, one "
            ":class:`~magi2_core.contracts.moe_weights.PreparedMoEWeights` from :func:`prepare_moe_weights`, "
            "with ``w_up`` and ``w_down`` left out.",
            layout=TENSOR,
        ),
        Arg("w_up", "torch.Tensor | None", "", None, layout=TENSOR, positional=True),
        Arg(
            "w_down",
            "torch.Tensor | None",
            "``[Hl·E, I, d]``, x's dtype and device, head-major.",
            None,
            layout=TENSOR,
            positional=True,
        ),
        deterministic_arg(),
    ),
    Pack(("w_gate", "w_up", "w_down"), (("weights", list[torch.Tensor]), ("layout", str)), _pack, _unpack),
)
_TENSORS = 6  # the leading tensor fields of ExpertsCall; a cache hit reuses the fields after them


class MoEExpertsKernel(Protocol):
    """What a ``moe_experts`` provider's kernel object is called with: one :class:`ExpertsCall`."""

    def __call__(self, call: ExpertsCall) -> torch.Tensor:
        """Return ``y [T, Hl, d]`` in x.dtype."""
        ...


@runtime_checkable
class MoEWeightPreparer(Protocol):
    """Optional on a ``moe_experts`` kernel object: lay one layer's weights out once, at load time.

    Returns ``(layout, tensors)`` for a layout named in :mod:`magi2_core.contracts.moe_weights`. Without this
    method the weights stay in checkpoint layout (the identity preparation). The kernel then receives
    the checkpoint-layout views of the prepared tensors and may recognise its own layout from their
    strides; a provider must serve any layout correctly, even one it did not prepare.
    """

    def prepare_weights(
        self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
    ) -> tuple[str, tuple[torch.Tensor, ...]]: ...


def _idx_in_range(i: torch.Tensor, e: int) -> None:
    if i.numel() and (i.device.type == "cpu" or checks.device_value_checks()):
        lo, hi = torch.aminmax(i)  # one pass over the ids
        low, high = lo.item(), hi.item()
        if low < 0 or high >= e:
            raise InvalidShapeError(OP, "idx", f"per-head expert ids in [0, {e})", f"values in [{low}, {high}]")


def validate(
    x: object,
    probs: object,
    idx: object,
    w_gate: object,
    w_up: object,
    w_down: object,
    *,
    deterministic: bool,
    compiling: bool,
) -> ExpertsCall:
    """Check every argument (raising an input error that names it)."""
    op = OP
    x = checks.head_activations(op, "x", x)
    t, hl, d = x.shape
    p = checks.tensor(op, "probs", probs)
    i = checks.tensor(op, "idx", idx)
    checks.dtype_in(op, "probs", p, (torch.float32,))
    if p.dim() != 3 or p.shape[0] != hl or p.shape[1] != t or p.shape[2] < 1:
        raise InvalidShapeError(op, "probs", f"FP32 [{hl}, {t}, top_k] (head-major)", checks.describe(p))
    if i.dtype not in (torch.int32, torch.int64):
        raise InvalidDTypeError(op, "idx", "of dtype int32 or int64", checks.describe(i))
    if tuple(i.shape) != tuple(p.shape):
        raise InvalidShapeError(op, "idx", f"shape {list(p.shape)} like probs", checks.describe(i))
    wg = checks.tensor(op, "w_gate", w_gate)
    wu = checks.tensor(op, "w_up", w_up)
    wd = checks.tensor(op, "w_down", w_down)
    if wg.dim() != 3 or hl == 0 or wg.shape[0] % hl != 0 or wg.shape[1] != d or wg.shape[0] == 0:
        raise InvalidShapeError(
            op, "w_gate", f"[heads·experts, {d}, intermediate] with a multiple of {hl} rows", checks.describe(wg)
        )
    f, _, inter = wg.shape
    if tuple(wu.shape) != (f, d, inter):
        raise InvalidShapeError(op, "w_up", f"[{f}, {d}, {inter}] like w_gate", checks.describe(wu))
    if tuple(wd.shape) != (f, inter, d):
        raise InvalidShapeError(op, "w_down", f"[{f}, {inter}, {d}]", checks.describe(wd))
    for arg, w in (("w_gate", wg), ("w_up", wu), ("w_down", wd)):
        if w.dtype != x.dtype:
            raise InvalidDTypeError(op, arg, f"of x's dtype {checks.dtype_name(x.dtype)}", checks.describe(w))
    checks.same_device(op, "x", x, probs=p, idx=i, w_gate=wg, w_up=wu, w_down=wd)
    e = f // hl
    k = p.shape[2]
    if k > e:
        raise InvalidShapeError(op, "probs", f"top_k <= {e} experts per head", f"top_k = {k}")
    _idx_in_range(i, e)
    call = ExpertsCall(x, p, i, wg, wu, wd, bool(deterministic), None)  # type: ignore[arg-type]
    mask = ARGS.features(call, compiling)
    return call._replace(key=ExpertsKey(x.device, checks.dtype_name(x.dtype), None, mask, t, hl, e, k, d, inter))


class _Layout(NamedTuple):
    kernel: Any
    provider: str
    rest: tuple[Any, ...]  # the validated call's fields after its tensors (deterministic and the key)
    recheck: int  # host ids: checked to lie in [0, recheck) on every call; 0: not checked


def _make(kernel: Any, name: str, call: ExpertsCall, args: tuple[Any, ...]) -> _Layout:
    """What a repeated call of this layout reuses (``args``: the declared arguments)."""
    host_ids = call.idx.numel() > 0 and call.idx.device.type == "cpu"
    return _Layout(kernel, name, call[_TENSORS:], call.key.num_experts if host_ids else 0)


def _recheck(hit: _Layout, idx: torch.Tensor) -> None:
    lo, hi = torch.aminmax(idx)  # host ids, on every call: one pass, two reads
    if lo.item() < 0 or hi.item() >= hit.recheck:
        _idx_in_range(idx, hit.recheck)  # raises, naming the values


@ARGS.public
def moe_experts(
    x: torch.Tensor,
    probs: torch.Tensor,
    idx: torch.Tensor,
    w_gate: torch.Tensor | PreparedMoEWeights,
    w_up: torch.Tensor | None = None,
    w_down: torch.Tensor | None = None,
    *,
    deterministic: bool | None = None,
    provider: str | None = None,
) -> torch.Tensor:
    """Routed experts with SwiGLU7: ``x [T, Hl, d] -> y [T, Hl, d]`` in x's dtype.

    Each (token, head) is sent to its K experts; expert e of head h is the MLP
    ``w_down[h·E+e]ᵀ·swiglu7(w_gate[h·E+e]ᵀ·x, w_up[h·E+e]ᵀ·x)`` and the K outputs are summed with
    the weights ``probs``. E is ``w_gate.shape[0] / Hl``; I is the expert's intermediate width.

    Returns:
        ``y [T, Hl, d]`` in x's dtype.
    """
    det = config.get("MAGI2_DETERMINISTIC") if deterministic is None else bool(deterministic)
    if isinstance(w_gate, PreparedMoEWeights):
        layout, weights = _weights_arg(w_gate, w_up, w_down)  # raises when w_up/w_down are given too
        wg, wu, wd = w_gate.w_gate, w_gate.w_up, w_gate.w_down
        asks_grad = True in [getattr(w, "requires_grad", False) for w in weights]
    else:
        layout, weights = CHECKPOINT, (w_gate, w_up, w_down)  # type: ignore[assignment]  # validated in _bind
        wg, wu, wd = w_gate, w_up, w_down  # type: ignore[assignment]
        asks_grad = False  # the weights themselves are read next
    # An `or` chain of attribute reads: a third of the cost of getattr over the weights on this hot path.
    try:
        asks_grad = (
            asks_grad
            or x.requires_grad
            or probs.requires_grad
            or wg.requires_grad
            or wu.requires_grad
            or wd.requires_grad
        )
    except AttributeError:  # not tensors: validation says which
        pass
    if asks_grad and torch.is_grad_enabled():
        names = ("w_gate", "w_up", "w_down") if layout == CHECKPOINT else [f"w_gate.tensors[{i}]" for i in range(3)]
        forward_only(OP, x=x, probs=probs, **dict(zip(names, weights, strict=False)))
    if torch.compiler.is_compiling():
        y: torch.Tensor = ARGS.compiled((x, probs, idx, w_gate, w_up, w_down, det), provider)
        return y
    b = _bind((x, probs, idx, wg, wu, wd, det), provider)  # the weights as checkpoint-layout views
    # one record per call, built without the NamedTuple's Python __new__ (concatenation: faster than *)
    call: ExpertsCall = record(ExpertsCall, (x, probs, idx, wg, wu, wd) + b.rest)  # noqa: RUF005
    out: torch.Tensor = b.kernel(call)
    return _shadow.observed(SPEC, b.provider, call, out)


def prepare_moe_weights(
    w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, *, provider: str | None = None
) -> PreparedMoEWeights:
    """Lay one layer's expert weights out for the provider that serves them; run once at load time.

    The provider is the one ``moe_experts`` would pick for these weights' device and dtype (or
    ``provider``). A provider without a preparation step keeps the checkpoint layout (no copy).
    The result does not track later in-place updates of the inputs: prepare again after loading.

    Args:
        w_gate, w_up: ``[Hl·E, d, I]``, BF16, FP16 or FP32 (the dtype of the activations they will
            meet), head-major, as :func:`moe_experts` takes them.
        w_down: ``[Hl·E, I, d]``, w_gate's dtype and device.
        provider: prepare for this provider instead of the one resolution picks.

    Returns:
        A :class:`~magi2_core.contracts.moe_weights.PreparedMoEWeights` (the provider's layout, its tensors on
        the weights' device): pass it as ``moe_experts(x, probs, idx, prepared)``.
    """
    wg, wu, wd = check_weights(w_gate, w_up, w_down)
    problem = Problem(
        op=OP,
        device_type=wg.device.type,
        dtype=checks.dtype_name(wg.dtype),
        hidden=wg.shape[1],
        intermediate=wg.shape[2],
    )
    name = resolve_problem(problem, provider).chosen
    loaded = get_registry().provider(OP, name or "")
    assert loaded is not None and name is not None  # resolve_problem raises when nothing is chosen
    kernel, _ = loaded.load()
    with torch.no_grad():
        wg, wu, wd = wg.detach(), wu.detach(), wd.detach()
        if isinstance(kernel, MoEWeightPreparer):
            layout, tensors = kernel.prepare_weights(wg, wu, wd)
        else:
            layout, tensors = CHECKPOINT, (wg, wu, wd)
    return PreparedMoEWeights.from_layout(name, layout, tuple(tensors))


def _accept(
    problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: ExpertsCall
) -> list[acc.Acceptance]:
    return [acc.accept_moe_experts(got["y"], ref["y"], problem.intermediate)]


SPEC: OpSpec[ExpertsCall, ExpertsKey] = OpSpec(ARGS, ExpertsKey, validate, outputs=("y",), accept=_accept)
_bind: Callable[..., _Layout] = cache_lookup(SPEC, _make, value_checked=True, recheck=("idx", _recheck))
custom_op(SPEC, torch.Tensor, fake_like("x"))
