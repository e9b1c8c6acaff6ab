"""A fake ``flash_attn.cute`` for CPU tests: FA4 4.0.0b36's varlen signature, FA4's sink arithmetic.

The fake's ``flash_attn_varlen_func`` has the real parameter list (names, order, defaults; the
fourth is ``qv``, so a positional ``cu_seqlens_q`` would land there and fail), records every
argument it was given, and computes what the real kernel computes, traced from its ``Softmax.finalize``: the sink-free
attention in FP32 (the reference provider, scores scaled then soft-capped), then the learnable sink
folded into the denominator as a natural-log logit, uncapped. Including FA4's non-finite behaviour:
a NaN row sum skips the normalisation, a row without keys gets ``lse = sink`` (``-inf`` when the
sink is ``+-inf``), and a call with no keys or no queries returns zeros and ``lse = sink`` at once.
It always returns ``(out, lse)`` with ``lse`` ``None`` unless ``return_lse=True``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from magi2_backend_reference.attention import exact_attention

INF = float("inf")


def fa4_sink_fold(o32: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FA4's ``Softmax.finalize`` with a learnable sink, in natural-log units on normalised rows."""
    s_ = sink.float()[:, None].expand_as(lse)
    empty = torch.isneginf(lse)  # no keys: row_max = -inf, row_sum = 0
    row_max = torch.where(empty, s_, lse)
    row_sum = torch.where(empty, 0.0, 1.0) + torch.exp(s_ - row_max)
    bad = (row_sum == 0) | torch.isnan(row_sum)
    scale = torch.where(bad, 1.0, 1.0 / row_sum)
    new_lse = torch.where(bad, -INF, row_max + torch.log(row_sum))
    return o32 * scale.t()[:, :, None], new_lse


class FakeFA4:
    """The fake module's varlen function and what it was called with."""

    def __init__(self, *, lse_layout: str = "ht") -> None:
        self.calls: list[dict[str, Any]] = []
        self.lse_layout = lse_layout
        self.error: Exception | None = None  # raised by the next call (a kernel failure)

    def flash_attn_varlen_func(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        qv: torch.Tensor | None = None,
        cu_seqlens_q: torch.Tensor | None = None,
        cu_seqlens_k: torch.Tensor | None = None,
        max_seqlen_q: int | None = None,
        max_seqlen_k: int | None = None,
        min_seqlen_k: int | None = None,
        seqused_q: torch.Tensor | None = None,
        seqused_k: torch.Tensor | None = None,
        gather_kv_indices: torch.Tensor | None = None,
        page_table: torch.Tensor | None = None,
        softmax_scale: float | None = None,
        causal: bool = False,
        window_size: tuple[int | None, int | None] = (None, None),
        learnable_sink: torch.Tensor | None = None,
        softcap: float = 0.0,
        num_splits: int = 1,
        pack_gqa: bool | None = None,
        deterministic: bool = False,
        score_mod: Any = None,
        score_mod_bwd: Any = None,
        mask_mod: Any = None,
        block_sparse_tensors: Any = None,
        aux_tensors: list[Any] | None = None,
        aux_scalars: tuple[Any, ...] | None = None,
        return_lse: bool = False,
        scheduler_metadata: Any = None,
        seqlen_k_per_split: int | None = None,
        disable_scheduler_metadata: bool = False,
        gather_bwd_recompute_p: bool = False,
        gather_bwd_token_chunk: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        given = {k_: v_ for k_, v_ in locals().items() if k_ != "self"}
        self.calls.append(given)
        if self.error is not None:
            raise self.error
        assert qv is None and window_size == (None, None) and score_mod is None and mask_mod is None
        assert cu_seqlens_q is not None and cu_seqlens_k is not None
        assert cu_seqlens_q.dtype == torch.int32 and cu_seqlens_k.dtype == torch.int32
        hq = q.shape[1]
        if learnable_sink is not None:  # the real asserts
            assert learnable_sink.shape == (hq,) and learnable_sink.dtype in (
                torch.float32,
                torch.bfloat16,
                torch.float16,
            )
        lse: torch.Tensor | None = None
        if k.shape[0] == 0 or q.shape[0] == 0:  # the real early return
            out = torch.zeros_like(q)
            if return_lse:
                lse = (
                    torch.full((hq, q.shape[0]), -INF)
                    if learnable_sink is None
                    else learnable_sink.float()[:, None].expand(hq, q.shape[0]).clone()
                )
        else:
            o32, lse32 = exact_attention(
                q.float(),
                k.float(),
                v.float(),
                cu_seqlens_q,
                cu_seqlens_k,
                softmax_scale=float(softmax_scale or q.shape[-1] ** -0.5),
                softcap=softcap,
                sinks=None,
                sink_rescale="fp32",
                return_lse=True,
            )
            assert lse32 is not None
            if learnable_sink is not None:
                o32, lse32 = fa4_sink_fold(o32, lse32, learnable_sink)
            out = o32.to(q.dtype)
            lse = lse32 if return_lse else None
        if lse is not None and self.lse_layout == "th":
            lse = lse.t().contiguous()
        return out, lse


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeFA4 | None, module: str = "fake_flash_attn_cute") -> str:
    """Put a fake FA4 module into ``sys.modules`` for this test only; return its name."""
    mod = types.ModuleType(module)
    if fake is not None:
        mod.flash_attn_varlen_func = fake.flash_attn_varlen_func  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module, mod)
    return module
