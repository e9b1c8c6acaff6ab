"""Packed gate/up bank for GEMM1: built once at load time (prepared weights), never cached for raw ones.

Layout (upstream #7206, the core's ``"w13_interleaved"``): packed[f, 2i] = w_gate[f, :, i],
packed[f, 2i+1] = w_up[f, :, i], shape [F, 2I, d]: the (gate, up) rows of one output channel are
adjacent and each row is contiguous over the reduction dim d, so one GEMM1 program streams a single
contiguous 2*BN*d chunk of weights.

Prepared weights hand the kernel checkpoint-layout views of the bank; `interleaved_bank` recognises
them from their strides, so nothing is copied. Raw checkpoint tensors are never packed into a copy that
outlives the call: a caller may write them in place between calls by routes that no cheap key sees
(``.data.copy_``, numpy, anything else that bypasses autograd's version counter), and a cached copy
would then be stale. The launcher reads them in place instead (`plan.without_bank`), or packs
them for that one call when an explicit plan asks for a bank (docs/moe-notes.md says why).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["interleaved_bank", "pack_w13"]


def pack_w13(w_gate: Tensor, w_up: Tensor) -> Tensor:
    """[F, d, I] x 2 -> [F, 2I, d] with gate/up interleaved per output channel."""
    f, d, i = w_gate.shape
    packed = torch.stack((w_gate.transpose(1, 2), w_up.transpose(1, 2)), dim=2)  # [F, I, 2, d]
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
