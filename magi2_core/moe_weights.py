"""MoE expert weights prepared once at load time in a provider's preferred layout.

``magi2_core.prepare_moe_weights(w_gate, w_up, w_down)`` (the ``moe_experts`` spec's preparation
hook) asks the provider that would serve these weights (or the one named) to lay them out for its kernel, and returns a :class:`PreparedMoEWeights` that
``moe_experts`` takes in place of the three tensors. A layout is a named storage format known to the
core, so any provider can read any prepared object: the object always exposes the checkpoint-layout
``w_gate``/``w_up``/``w_down``, as views of its storage where the layout allows it (no second copy).

Layouts:

- ``"checkpoint"``: ``(w_gate [F, d, I], w_up [F, d, I], w_down [F, I, d])`` as loaded.
- ``"w13_interleaved"``: ``(w13 [F, 2I, d], w_down [F, I, d])`` with ``w13[f, 2i] = w_gate[f, :, i]``
  and ``w13[f, 2i+1] = w_up[f, :, i]``: each (gate, up) output channel pair is adjacent and
  contiguous over ``d``. ``w_gate``/``w_up`` are strided views of ``w13``.

The router weight of ``moe_route`` is prepared the same way, by
``magi2_core.prepare_router_weight(router_weight, num_heads=...)``, into a
:class:`PreparedRouterWeight` that ``moe_route`` takes in place of the tensor. Layouts:

- ``"checkpoint"``: ``(router_weight [F, d] FP32,)`` as loaded.
- ``"router_bf16x3"``: ``(router_weight, planes [3, F, d] BF16)``, the planes an exact split of the weight
  (:func:`split_router_bf16x3`) for BF16 tensor-core dots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from magi2_core.contracts import _checks as ck
from magi2_core.errors import InvalidDTypeError, InvalidShapeError, InvalidValueError

__all__ = ["CHECKPOINT", "LAYOUTS", "ROUTER_BF16X3", "ROUTER_LAYOUTS", "W13_INTERLEAVED", "PreparedMoEWeights",
           "PreparedRouterWeight", "check_weights", "checkpoint_views", "split_router_bf16x3"]

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


def check_weights(w_gate: object, w_up: object, w_down: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three checkpoint-layout tensors, checked against each other (what preparation needs)."""
    wg, wu, wd = ck.tensor(_OP, "w_gate", w_gate), ck.tensor(_OP, "w_up", w_up), ck.tensor(_OP, "w_down", w_down)
    if wg.dtype not in ck.FLOATS:  # said here, not as "no eligible provider" by the resolver
        names = " or ".join(ck.dtype_name(d) for d in ck.FLOATS)
        raise InvalidDTypeError(_OP, "w_gate", f"of dtype {names} (moe_experts' activation dtypes, which the "
                                "weights share)", ck.describe(wg))
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


# ---------------------------------------------------------------------------------------------
# the router weight (``moe_route``): prepared once at load time too
# ---------------------------------------------------------------------------------------------
ROUTER_BF16X3 = "router_bf16x3"
ROUTER_LAYOUTS = (CHECKPOINT, ROUTER_BF16X3)
_ROUTER_OP = "prepare_router_weight"


def split_router_bf16x3(router_weight: torch.Tensor) -> torch.Tensor:
    """``[3, F, d]`` BF16 planes ``hi, mid, lo`` with ``hi + mid + lo == router_weight`` exactly.

    ``hi`` is the weight's top 16 bits (the FP32 value truncated to 8 significant bits), ``mid`` the top
    16 bits of the rest, ``lo`` what remains (at most 8 significant bits, so exact in BF16): an FP32
    significand has 24 bits. Exact for every ``|w| >= 2**-110``; below that ``lo`` would be a BF16
    subnormal and loses bits (an absolute error under ``2**-133``). A BF16 activation times each plane is exact in FP32, so three BF16 dots
    summed in FP32 give the FP32 logits on tensor cores. Truncation (not rounding) makes the split a
    function of the bits alone: a kernel reading the FP32 weight can form the same planes in registers.
    """
    w = router_weight.detach().contiguous()
    top = -(2**16)  # 0xFFFF0000 as an int32 mask
    hi = (w.view(torch.int32) & top).view(torch.float32)
    rest = w - hi
    mid = (rest.view(torch.int32) & top).view(torch.float32)
    lo = rest - mid
    return torch.stack([hi, mid, lo]).bfloat16()


def _weight_stamp(w: torch.Tensor) -> tuple[int, int]:
    """(storage address, version counter); -1 for an inference tensor, which has no version counter."""
    try:
        return w.data_ptr(), w._version
    except RuntimeError:
        return w.data_ptr(), -1


@dataclass(frozen=True, eq=False)
class PreparedRouterWeight:
    """One layer's FP32 router weight ``[Hl·E, d]`` with what ``provider`` derived from it for its kernel.

    ``tensors[0]`` is the weight itself (not a copy): every provider routes with it, and a call given
    this object computes exactly what the plain weight gives. The tensors after it are the layout's
    derived data (``"router_bf16x3"``: :func:`split_router_bf16x3`), made when ``stamp`` (the weight's
    address and version counter) was taken. The derived data is used only while :meth:`current`; after
    an in-place write the kernel reads the weight itself (same result, the slower path), until the
    weight is prepared again. A write that bypasses the version counter (``param.data.copy_(...)``)
    cannot be seen: prepare again after one.
    """

    provider: str
    layout: str
    tensors: tuple[torch.Tensor, ...]
    stamp: tuple[int, int]

    @classmethod
    def from_layout(cls, provider: str, layout: str, tensors: tuple[torch.Tensor, ...],
                    stamp: tuple[int, int] | None = None) -> PreparedRouterWeight:
        """Check ``tensors`` against ``layout`` (stamped now unless ``stamp`` is given)."""
        if layout not in ROUTER_LAYOUTS:
            raise InvalidValueError(_ROUTER_OP, "layout", " | ".join(repr(x) for x in ROUTER_LAYOUTS), repr(layout))
        want = 1 if layout == CHECKPOINT else 2
        if len(tensors) != want:
            raise InvalidShapeError(_ROUTER_OP, "tensors", f"{want} tensors for layout {layout!r}", f"{len(tensors)}")
        w = tensors[0]
        if w.dtype != torch.float32 or w.dim() != 2:
            raise InvalidShapeError(_ROUTER_OP, "router_weight", "FP32 [heads·experts, hidden]", ck.describe(w))
        if layout == ROUTER_BF16X3:
            planes = tensors[1]
            if planes.dtype != torch.bfloat16 or tuple(planes.shape) != (3, *w.shape) or not planes.is_contiguous():
                raise InvalidShapeError(_ROUTER_OP, "planes", f"contiguous BF16 [3, {w.shape[0]}, {w.shape[1]}]",
                                        ck.describe(planes))
            ck.same_device(_ROUTER_OP, "router_weight", w, planes=planes)
        return cls(provider, layout, tuple(tensors), _weight_stamp(w) if stamp is None else stamp)

    @property
    def weight(self) -> torch.Tensor:
        return self.tensors[0]

    def current(self) -> bool:
        """Does the derived data still describe the weight (same storage, no in-place write since)?"""
        return self.stamp[1] >= 0 and _weight_stamp(self.weight) == self.stamp

    def current_for(self, weight: torch.Tensor) -> bool:
        """Was this object prepared from ``weight`` as it is now (same storage, shape, version)?"""
        return (weight.shape == self.weight.shape and weight.stride() == self.weight.stride()
                and self.stamp[1] >= 0 and _weight_stamp(weight) == self.stamp)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{list(t.shape)}" for t in self.tensors)
        return f"PreparedRouterWeight(provider={self.provider!r}, layout={self.layout!r}, tensors=[{shapes}])"
