"""Packed gate/up bank for GEMM1: built once at load time (prepared weights) or cached per layer.

Layout (upstream #7206, the core's ``"w13_interleaved"``): packed[f, 2i] = w_gate[f, :, i],
packed[f, 2i+1] = w_up[f, :, i], shape [F, 2I, d]: the (gate, up) rows of one output channel are
adjacent and each row is contiguous over the reduction dim d, so one GEMM1 program streams a single
contiguous 2*BN*d chunk of weights.

Prepared weights hand the kernel checkpoint-layout views of the bank; `interleaved_bank` recognises
them from their strides, so nothing is copied or cached. Raw checkpoint tensors go through a bounded
LRU cache keyed by storage, offset, version counter, shape, stride, dtype and device, with entries
dropped as soon as a source tensor is garbage collected (weak references).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch
from torch import Tensor

__all__ = ["PackedW13Cache", "interleaved_bank", "pack_count", "pack_w13"]

_PACKS = 0


def pack_count() -> int:
    """How many banks were built in this process (a test and benchmark hook)."""
    return _PACKS


def pack_w13(w_gate: Tensor, w_up: Tensor) -> Tensor:
    """[F, d, I] x 2 -> [F, 2I, d] with gate/up interleaved per output channel."""
    global _PACKS
    f, d, i = w_gate.shape
    packed = torch.stack((w_gate.transpose(1, 2), w_up.transpose(1, 2)), dim=2)  # [F, I, 2, d]
    _PACKS += 1
    return packed.reshape(f, 2 * i, d).contiguous()


def interleaved_bank(w_gate: Tensor, w_up: Tensor) -> Tensor | None:
    """The [F, 2I, d] bank that ``w_gate``/``w_up`` are strided views of, or None if they are not."""
    f, d, i = w_gate.shape
    strides = (2 * i * d, 1, 2 * d)
    if (
        w_gate.stride() != strides
        or w_up.stride() != strides
        or w_up.shape != w_gate.shape
        or w_up.dtype != w_gate.dtype
        or w_up.device != w_gate.device
        or w_up.untyped_storage().data_ptr() != w_gate.untyped_storage().data_ptr()
        or w_up.storage_offset() != w_gate.storage_offset() + d
    ):
        return None
    return w_gate.as_strided((f, 2 * i, d), (2 * i * d, d, 1))


def _version(t: Tensor) -> int | None:
    # Inference tensors have no version counter; they cannot be modified in place either.
    try:
        return int(t._version)
    except RuntimeError:
        return None


def _key(t: Tensor) -> tuple[object, ...]:
    return (
        t.untyped_storage().data_ptr(), t.storage_offset(), _version(t), tuple(t.shape), tuple(t.stride()),
        t.dtype, t.device,
    )  # fmt: skip


class PackedW13Cache:
    """Packed banks of the last ``capacity`` raw (gate, up) pairs, least recently used evicted first."""

    def __init__(self, capacity: int = 8) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[object, ...], tuple[Tensor, tuple[weakref.ref[Tensor], ...]]] = OrderedDict()
        self.builds = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, w_gate: Tensor, w_up: Tensor) -> Tensor:
        key = (_key(w_gate), _key(w_up))
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            return hit[0]
        while len(self._entries) >= max(self.capacity, 1):
            self._entries.popitem(last=False)
        packed = pack_w13(w_gate.detach(), w_up.detach())
        self.builds += 1
        # The storage address in the key could be reused once the source is freed: the weak
        # references drop the entry as soon as either source tensor dies.
        evict = _evictor(weakref.ref(self), key)
        self._entries[key] = (packed, (weakref.ref(w_gate, evict), weakref.ref(w_up, evict)))
        return packed

    def _drop(self, key: tuple[object, ...]) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()


def _evictor(cache: weakref.ref[PackedW13Cache], key: tuple[object, ...]) -> object:
    def evict(_: object) -> None:
        c = cache()
        if c is not None:
            c._drop(key)

    return evict
