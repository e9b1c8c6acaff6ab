"""MoE expert weights prepared once at load time in a provider's preferred layout.

``magi2_core.prepare_moe_weights(w_gate, w_up, w_down)`` (the ``moe_experts`` spec's preparation
hook) asks the provider that would serve these weights (or the one named) to lay them out for its kernel,
and returns a :class:`PreparedMoEWeights` that
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

from magi2_core.contracts import _checks as checks
from magi2_core.errors import InvalidDTypeError, InvalidShapeError, InvalidValueError

__all__ = ["CHECKPOINT", "LAYOUTS", "W13_INTERLEAVED", "PreparedMoEWeights", "check_weights", "checkpoint_views"]

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
            raise InvalidShapeError(_OP, "w13", f"[{f}, {2 * i}, {d}] (gate/up interleaved)", checks.describe(w13))
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


def check_weights(w_gate: object, w_up: object, w_down: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three checkpoint-layout tensors, checked against each other (what preparation needs)."""
    wg, wu, wd = (
        checks.tensor(_OP, "w_gate", w_gate),
        checks.tensor(_OP, "w_up", w_up),
        checks.tensor(_OP, "w_down", w_down),
    )
    if wg.dtype not in checks.FLOATS:  # said here, not as "no eligible provider" by the resolver
        names = " or ".join(checks.dtype_name(d) for d in checks.FLOATS)
        raise InvalidDTypeError(
            _OP,
            "w_gate",
            f"of dtype {names} (moe_experts' activation dtypes, which the weights share)",
            checks.describe(wg),
        )
    if wg.dim() != 3 or 0 in wg.shape:
        raise InvalidShapeError(_OP, "w_gate", "[heads·experts, hidden, intermediate], non-empty", checks.describe(wg))
    f, d, i = wg.shape
    if tuple(wu.shape) != (f, d, i):
        raise InvalidShapeError(_OP, "w_up", f"[{f}, {d}, {i}] like w_gate", checks.describe(wu))
    if tuple(wd.shape) != (f, i, d):
        raise InvalidShapeError(_OP, "w_down", f"[{f}, {i}, {d}]", checks.describe(wd))
    for arg, w in (("w_up", wu), ("w_down", wd)):
        if w.dtype != wg.dtype:
            raise InvalidDTypeError(_OP, arg, f"of w_gate's dtype {checks.dtype_name(wg.dtype)}", checks.describe(w))
    checks.same_device(_OP, "w_gate", wg, w_up=wu, w_down=wd)
    return wg, wu, wd
