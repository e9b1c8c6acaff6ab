"""MoE expert weights prepared once at load time in a provider's preferred layout.

``prepare_moe_weights(w_gate, w_up, w_down)`` asks the provider that would serve these weights (or
the one named) to lay them out for its kernel, and returns a :class:`PreparedMoEWeights` that
``moe_experts`` takes in place of the three tensors. A layout is a named storage format known to the
core, so any provider can read any prepared object: the object always exposes the checkpoint-layout
``w_gate``/``w_up``/``w_down``, as views of its storage where the layout allows it (no second copy).

Layouts:

- ``"checkpoint"``: ``(w_gate [F, d, I], w_up [F, d, I], w_down [F, I, d])`` as loaded.
- ``"w13_interleaved"``: ``(w13 [F, 2I, d], w_down [F, I, d])`` with ``w13[f, 2i] = w_gate[f, :, i]``
  and ``w13[f, 2i+1] = w_up[f, :, i]``: each (gate, up) output channel pair is adjacent and
  contiguous over ``d``. ``w_gate``/``w_up`` are strided views of ``w13``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from magi2_core.contracts import _checks as ck
from magi2_core.errors import InvalidDTypeError, InvalidShapeError, InvalidValueError
from magi2_core.problem import Problem
from magi2_core.provider import MoEWeightPreparer
from magi2_core.registry import get_registry
from magi2_core.resolver import resolve_problem

__all__ = ["CHECKPOINT", "LAYOUTS", "W13_INTERLEAVED", "PreparedMoEWeights", "checkpoint_views", "prepare_moe_weights"]

CHECKPOINT = "checkpoint"
W13_INTERLEAVED = "w13_interleaved"
LAYOUTS = (CHECKPOINT, W13_INTERLEAVED)
_OP = "prepare_moe_weights"


def checkpoint_views(layout: str, tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(w_gate, w_up, w_down)`` in checkpoint layout from a layout's tensors (views, no copy)."""
    if layout == CHECKPOINT and len(tensors) == 3:
        return tensors[0], tensors[1], tensors[2]
    if layout == W13_INTERLEAVED and len(tensors) == 2:
        w13, w_down = tensors
        f, i, d = w_down.shape
        if tuple(w13.shape) != (f, 2 * i, d):
            raise InvalidShapeError(_OP, "w13", f"[{f}, {2 * i}, {d}] (gate/up interleaved)", ck.describe(w13))
        return w13[:, 0::2, :].transpose(1, 2), w13[:, 1::2, :].transpose(1, 2), w_down
    if layout not in LAYOUTS:
        raise InvalidValueError(_OP, "layout", " | ".join(repr(x) for x in LAYOUTS), repr(layout))
    want = 3 if layout == CHECKPOINT else 2
    raise InvalidShapeError(_OP, "tensors", f"{want} tensors for layout {layout!r}", f"{len(tensors)}")


@dataclass(frozen=True, eq=False)
class PreparedMoEWeights:
    """One layer's expert weights in ``layout``, prepared by ``provider``.

    ``tensors`` is what the layout stores (and what a compiled graph passes through the op);
    ``w_gate``/``w_up``/``w_down`` are the checkpoint-layout views any provider can read.
    """

    provider: str
    layout: str
    tensors: tuple[torch.Tensor, ...]
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor

    @classmethod
    def from_layout(cls, provider: str, layout: str, tensors: tuple[torch.Tensor, ...]) -> PreparedMoEWeights:
        w_gate, w_up, w_down = checkpoint_views(layout, tuple(tensors))
        return cls(provider, layout, tuple(tensors), w_gate, w_up, w_down)

    @property
    def nbytes(self) -> int:
        """Bytes of device memory this object keeps alive (each storage counted once)."""
        storages = {}
        for t in self.tensors:
            s = t.untyped_storage()
            storages[(t.device, s.data_ptr())] = s.nbytes()
        return sum(storages.values())

    def __repr__(self) -> str:
        shapes = ", ".join(f"{list(t.shape)}" for t in self.tensors)
        return f"PreparedMoEWeights(provider={self.provider!r}, layout={self.layout!r}, tensors=[{shapes}])"


def _check(w_gate: object, w_up: object, w_down: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    wg, wu, wd = ck.tensor(_OP, "w_gate", w_gate), ck.tensor(_OP, "w_up", w_up), ck.tensor(_OP, "w_down", w_down)
    if wg.dim() != 3 or 0 in wg.shape:
        raise InvalidShapeError(_OP, "w_gate", "[heads·experts, hidden, intermediate], non-empty", ck.describe(wg))
    f, d, i = wg.shape
    if tuple(wu.shape) != (f, d, i):
        raise InvalidShapeError(_OP, "w_up", f"[{f}, {d}, {i}] like w_gate", ck.describe(wu))
    if tuple(wd.shape) != (f, i, d):
        raise InvalidShapeError(_OP, "w_down", f"[{f}, {i}, {d}]", ck.describe(wd))
    for arg, w in (("w_up", wu), ("w_down", wd)):
        if w.dtype != wg.dtype:
            raise InvalidDTypeError(_OP, arg, f"of w_gate's dtype {ck.dtype_name(wg.dtype)}", ck.describe(w))
    ck.same_device(_OP, "w_gate", wg, w_up=wu, w_down=wd)
    return wg, wu, wd


def prepare_moe_weights(
    w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor, *, provider: str | None = None
) -> PreparedMoEWeights:
    """Lay one layer's expert weights out for the provider that serves them; run once at load time.

    The provider is the one ``moe_experts`` would pick for these weights' device and dtype (or
    ``provider``). A provider without a preparation step keeps the checkpoint layout (no copy).
    The result does not track later in-place updates of the inputs: prepare again after loading.
    """
    wg, wu, wd = _check(w_gate, w_up, w_down)
    problem = Problem(
        op="moe_experts",
        device_type=wg.device.type,
        dtype=ck.dtype_name(wg.dtype),
        hidden=wg.shape[1],
        intermediate=wg.shape[2],
    )
    name = resolve_problem(problem, provider).chosen
    loaded = get_registry().provider("moe_experts", name or "")
    assert loaded is not None and name is not None  # resolve_problem raises when nothing is chosen
    kernel, _ = loaded.load()
    with torch.no_grad():
        wg, wu, wd = wg.detach(), wu.detach(), wd.detach()
        if isinstance(kernel, MoEWeightPreparer):
            layout, tensors = kernel.prepare_weights(wg, wu, wd)
        else:
            layout, tensors = CHECKPOINT, (wg, wu, wd)
    return PreparedMoEWeights.from_layout(name, layout, tuple(tensors))
