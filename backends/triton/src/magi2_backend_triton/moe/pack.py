"""Packed gate/up bank for GEMM1, built once per weight version and cached.

Layout (upstream #7206): packed[f, 2i] = w_gate[f, :, i], packed[f, 2i+1] = w_up[f, :, i], shape
[F, 2I, d]: the (gate, up) rows of one output channel are adjacent and each row is contiguous over
the reduction dim d, so one GEMM1 program streams a single contiguous 2*BN*d chunk of weights.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor


def pack_w13(w_gate: Tensor, w_up: Tensor) -> Tensor:
    """[F, d, I] x 2 -> [F, 2I, d] with gate/up interleaved per output channel."""
    f, d, i = w_gate.shape
    packed = torch.stack((w_gate.transpose(1, 2), w_up.transpose(1, 2)), dim=2)  # [F, I, 2, d]
    return packed.reshape(f, 2 * i, d).contiguous()


def _version(t: Tensor) -> int | None:
    # Inference tensors have no version counter; they cannot be modified in place either.
    try:
        return int(t._version)
    except RuntimeError:
        return None


def _key(
    t: Tensor,
) -> tuple[int, int, int | None, torch.device, torch.dtype, tuple[int, ...]]:
    return (id(t), t.data_ptr(), _version(t), t.device, t.dtype, tuple(t.stride()))


@dataclass
class PackedW13Cache:
    """One packed bank, valid while both source tensors are the same objects at the same version."""

    _refs: tuple[weakref.ref[Tensor], weakref.ref[Tensor]] | None = None
    _key: tuple[object, ...] | None = None
    _packed: Tensor | None = None
    builds: int = field(default=0)

    def get(self, w_gate: Tensor, w_up: Tensor) -> Tensor:
        key = (_key(w_gate), _key(w_up))
        # The weak references guard against a freed tensor whose id and address were reused.
        alive = self._refs is not None and self._refs[0]() is w_gate and self._refs[1]() is w_up
        if self._packed is None or not alive or key != self._key:
            self._packed = None  # free the stale bank before building the new one
            self._packed = pack_w13(w_gate.detach(), w_up.detach())
            self._refs = (weakref.ref(w_gate), weakref.ref(w_up))
            self._key = key
            self.builds += 1
        return self._packed

    def clear(self) -> None:
        self._refs, self._key, self._packed = None, None, None
