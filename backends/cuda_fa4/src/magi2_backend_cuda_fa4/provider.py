"""The FA4 attention provider's kernel object: run-time availability (``check``) and the call.

Inputs arrive validated by the core's attention contract (int32 prefix sums on q's device, Python
int max lengths, ``softcap = max(softcap, 0)``, sinks ``None`` or FP32 ``[S, Hq]``). The call is
non-causal, block-diagonal over the segments, one pass per row (``num_splits=1``: deterministic),
with FA4's own GQA (q head h reads kv head ``h // (Hq/Hkv)``, the contract's grouping).

Sinks, by ``sink_rescale``:

* ``"fp32"``: native. The sinks become one FP32 logit per head (:mod:`magi2_backend_cuda_fa4.native_sinks`)
  passed as ``learnable_sink``; FA4 folds it into the FP32 softmax denominator and rounds the output
  once, which is the contract's FP32 rescale without the intermediate rounding. Its LSE includes
  the sink.
* ``"activation"``: the contract rounds the sink-free output to q's dtype, then multiplies by the
  scale rounded to q's dtype (upstream MAGI-2 on CUDA). A native sink cannot reproduce that double
  rounding, so FA4 runs without it, returns its LSE, and the core's sink correction for CUDA (the
  fused Triton kernel where magi2-backend-triton contributes it) applies it, exactly as after FA3.

FA4 compiles a kernel per configuration on first use (dtype, head dim, GQA ratio, sink, softcap,
LSE): see :func:`magi2_backend_cuda_fa4.warmup`. Run-time failures propagate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from magi2_backend_cuda_fa3.base import FlashAttentionProvider, capability_unknown, device_capability

from magi2_backend_cuda_fa4.abi import FA4Abi, load_fa4
from magi2_backend_cuda_fa4.native_sinks import contract_lse, native_sink
from magi2_core.backend import CheckedOn, Problem, Reason, ReasonCode, VirtualDevice

if TYPE_CHECKING:
    from magi2_core.backend import AttentionCall

__all__ = ["CC_MAJORS", "FA4Attention", "device_capability", "fa4_attention"]

# Hopper (FA4's sm90 kernels) and Blackwell B200/GB200 (sm100). FA4 also has sm80/sm120 paths; they
# are not claimed: MAGI-2's sinks on them were neither read through nor run.
CC_MAJORS = (9, 10)


class FA4Attention(FlashAttentionProvider[FA4Abi]):
    """An ``AttentionKernel``: called with one ``AttentionCall``; ``check`` says where it cannot run.

    Its :attr:`sink_correction` serves ``sink_rescale="activation"`` (see the module doc)."""

    label = "FA4"
    default_loader = staticmethod(load_fa4)

    def check(self, problem: Problem) -> Sequence[Reason]:
        abi = self.loaded.abi
        if abi is None:
            return [
                Reason(
                    code=ReasonCode.UNAVAILABLE,
                    field="fa4",
                    expected="flash-attn-4 (flash_attn.cute)",
                    actual="none usable",
                    detail=self.loaded.why_none(),
                )
            ]
        cc = self._capability(problem.device_index)
        if cc is None:
            return [
                Reason(
                    code=ReasonCode.UNAVAILABLE,
                    field="cuda",
                    expected="a CUDA device",
                    actual="none",
                    detail=f"torch {torch.__version__}; FA4 build {abi.label}",
                )
            ]
        return _capability_reasons(cc, abi.label)

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        """For a described device: judged on its capability, flash-attn-4 assumed installed there."""
        cc = device.compute_capability
        if cc is None:
            return CheckedOn((capability_unknown(self.label),))
        abi = self.loaded.abi
        if abi is not None:
            return CheckedOn(
                tuple(_capability_reasons(cc, abi.label)),
                (f"judged with this host's build, {abi.label}, as installed there",),
            )
        assumed = f"flash-attn-4 does not import here ({self.loaded.why_none()}); assumed installed on that device"
        return CheckedOn(tuple(_capability_reasons(cc, "FA4")), (assumed,))

    def __call__(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        abi = self._abi()
        q, sinks, sink_rescale, return_lse = call.q, call.sinks, call.sink_rescale, call.return_lse
        native = native_sink(sinks) if sinks is not None and sink_rescale == "fp32" else None
        correct = sinks is not None and native is None
        need_lse = return_lse or correct
        # FA4 treats exactly 0.0 as "no cap"; the contract already clamped a disabled cap to 0.0.
        result = abi.varlen(
            q=q,
            k=call.k,
            v=call.v,
            cu_seqlens_q=call.cu_seqlens_q,
            cu_seqlens_k=call.cu_seqlens_k,
            max_seqlen_q=call.max_seqlen_q,
            max_seqlen_k=call.max_seqlen_k,
            softmax_scale=call.softmax_scale,
            causal=False,
            softcap=max(float(call.softcap), 0.0),
            learnable_sink=None if native is None else native.logit,
            num_splits=1,
            return_lse=need_lse,
        )
        o, lse = self._unpack(result, q, need_lse, abi)
        if correct:
            assert sinks is not None and lse is not None
            o, lse = self.sink_correction.apply(o, lse, sinks, rescale=sink_rescale, return_lse=return_lse)
        elif native is not None and lse is not None:
            lse = contract_lse(lse, native)
        return o, lse if return_lse else None

    @staticmethod
    def _unpack(result: Any, q: torch.Tensor, need_lse: bool, abi: FA4Abi) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise RuntimeError(
                f"{abi.label}: flash_attn_varlen_func returned {type(result).__name__}, expected the pair (out, lse)"
            )
        o, lse = result
        if not isinstance(o, torch.Tensor) or o.shape != q.shape or o.dtype != q.dtype:
            got = f"{list(o.shape)} {o.dtype}" if isinstance(o, torch.Tensor) else type(o).__name__
            raise RuntimeError(f"{abi.label} returned out {got}, expected {list(q.shape)} {q.dtype}")
        if not need_lse:
            return o, None
        tq, hq = q.shape[0], q.shape[1]
        if not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32:
            got = f"{lse.dtype}" if isinstance(lse, torch.Tensor) else type(lse).__name__
            raise RuntimeError(f"{abi.label}: return_lse=True gave LSE {got}, expected torch.float32")
        if tuple(lse.shape) == (hq, tq):  # FA4's varlen layout (checked first: Tq == Hq is ambiguous)
            return o, lse
        if tuple(lse.shape) == (tq, hq):  # FA4's layout when heads are minor (its MLA path)
            return o, lse.t().contiguous()
        raise RuntimeError(
            f"{abi.label} returned LSE {list(lse.shape)}, expected [Hq, Tq] = {[hq, tq]} or [Tq, Hq] = {[tq, hq]}"
        )


def _capability_reasons(cc: tuple[int, int], label: str) -> list[Reason]:
    """Why FA4 (``label``: the build) is not served on a device of capability ``cc`` (empty: it is)."""
    if cc[0] in CC_MAJORS:
        return []
    return [
        Reason(
            code=ReasonCode.CHECK,
            field="compute_capability",
            expected=" | ".join(f"{m}.x" for m in CC_MAJORS),
            actual=f"{cc[0]}.{cc[1]}",
            detail=f"{label}: MAGI-2 attention is served on its sm90 (Hopper) and sm100 "
            "(Blackwell B200/GB200) kernels only",
        )
    ]


fa4_attention = FA4Attention()
