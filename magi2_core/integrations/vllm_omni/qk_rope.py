"""vllm-omni's attention input projection, its q/k tail served by :func:`magi2_core.qk_norm_rope`.

vllm-omni 0.30.0's ``Magi2Attention.project`` runs the pre-norm, the gate and QKV projections, then for q
and k: the per-head ``MultiModalityRMSNorm`` to FP32, ``inverse_permute`` (back to sequence order),
``apply_rotary_emb`` in FP32 and a cast to the checkpoint dtype; v is only moved back and cast.
:class:`AttentionProjectMethods` holds the replacement the plugin sets on that class: the same
projections, then one ``qk_norm_rope`` call each for q and k (read in place from the packed projection)
and upstream's own steps for v. It reads the layer's own modules and parameters (``q_norm.weight``,
``k_norm.weight``, their ``eps``), so the checkpoint is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from magi2_core import ops
from magi2_core.errors import InvalidValueError

__all__ = ["METHODS", "AttentionProjectMethods"]

METHODS = ("project",)


def _norm_rope(norm: Any, x: torch.Tensor, rope: torch.Tensor, dispatcher: Any, out_dtype: torch.dtype) -> torch.Tensor:
    """``norm`` (vllm-omni's per-head q or k norm, FP32 out), ``inverse_permute``, RoPE and the cast, as one op."""
    if norm.num_patterns != 1 or norm.out_dtype not in (None, torch.float32):
        raise InvalidValueError(
            "Magi2Attention.project",
            "q_norm/k_norm",
            "per-head norms with one pattern and FP32 output, as vllm-omni 0.30.0 builds them "
            "(MAGI2_VLLM_OMNI_QK_ROPE=0 keeps vllm-omni's own projection)",
            f"num_patterns={norm.num_patterns}, out_dtype={norm.out_dtype}",
        )
    sizes: Sequence[int] | None = list(dispatcher.group_size_cpu) if norm.num_modality > 1 else None
    return ops.qk_norm_rope(
        x,
        norm.weight,
        rope,
        eps=norm.eps,
        modality_sizes=sizes,
        index=dispatcher.inv_permute_mapping,
        out_dtype=out_dtype,
    )


class AttentionProjectMethods:
    """The replacement of vllm-omni's ``Magi2Attention.project`` (``self`` is that module)."""

    def project(
        self: Any, hidden_states: torch.Tensor, rope: torch.Tensor, modality_dispatcher: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        normalized = self.pre_norm(hidden_states, modality_dispatcher)
        gates = self.linear_g(normalized, modality_dispatcher)
        qkv = self.linear_qkv(normalized, modality_dispatcher)
        q, k, v = torch.split(qkv, [self.q_size, self.kv_size, self.kv_size], dim=-1)
        dtype = self.config.params_dtype
        q = _norm_rope(self.q_norm, q.view(-1, self.num_heads_q, self.head_dim), rope, modality_dispatcher, dtype)
        k = _norm_rope(self.k_norm, k.view(-1, self.num_heads_kv, self.head_dim), rope, modality_dispatcher, dtype)
        v = modality_dispatcher.inverse_permute(v.view(-1, self.num_heads_kv, self.head_dim)).to(dtype)
        return q, k, v, gates.view(-1, self.num_heads_q, 1)
