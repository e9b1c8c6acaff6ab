"""The FA3 attention provider's kernel object: run-time availability (``check``) and the call.

Inputs arrive validated by the core's attention contract (int32 prefix sums on q's device, Python
int max lengths, ``softcap = max(softcap, 0)``, sinks ``None`` or FP32 ``[S, Hq]``). The call is
non-causal, block-diagonal over the segments, with FA3's own GQA (q head h reads kv head
``h // (Hq/Hkv)``, the contract's grouping).

Sinks: a build with native ``sinks`` (tokenspeed-fa3: one natural-log logit per head) gets them
directly only when that meets the contract exactly as stated: one sink row (``S == 1``), FP32
rescale, and no LSE requested (whether the native LSE includes the sink is not documented).
Otherwise FA3 runs without sinks and returns its LSE, and the selected correction
(:func:`magi2_core.sink_correction.choice.sink_correction_for`) folds the sinks in. Run-time failures propagate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from magi2_backend_cuda_fa3.abi import FA3Abi, load_fa3
from magi2_backend_cuda_fa3.base import FlashAttentionProvider, capability_unknown, device_capability
from magi2_core.backend import CheckedOn, Feature, Problem, Reason, ReasonCode, VirtualDevice

if TYPE_CHECKING:
    from magi2_core.backend import AttentionCall

__all__ = ["FA3Attention", "device_capability", "fa3_attention"]


class FA3Attention(FlashAttentionProvider[FA3Abi]):
    """An ``AttentionKernel``: called with one ``AttentionCall``; ``check`` says where it cannot run."""

    label = "FA3"
    default_loader = staticmethod(load_fa3)

    def check(self, problem: Problem) -> Sequence[Reason]:
        loaded = self.loaded
        abi = loaded.abi
        if abi is None:
            return [
                Reason(
                    code=ReasonCode.UNAVAILABLE,
                    field="fa3",
                    actual="none usable",
                    detail=loaded.why_none(),
                    expected="an FA3 build: fa3-fwd, flash_attn_3 (3.x) or tokenspeed-fa3",
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
                    detail=f"torch {torch.__version__}; FA3 build {abi.label}",
                )
            ]
        return self._build_reasons(abi, cc, problem)

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        """For a described device: this host's FA3 build, or where none imports here, a build with sm90a
        kernels (what fa3-fwd, flash_attn_3 and tokenspeed-fa3 have in common), assumed installed there."""
        cc = device.compute_capability
        if cc is None:
            return CheckedOn((capability_unknown(self.label),))
        abi = self.loaded.abi
        if abi is not None:
            return CheckedOn(
                tuple(self._build_reasons(abi, cc, problem)),
                (f"judged with this host's build, {abi.label}, as installed there",),
            )
        assumed = (
            f"no FA3 build imports here ({self.loaded.why_none()}); judged as a build with sm90a kernels "
            f"installed on that device (fa3-fwd, flash_attn_3 or tokenspeed-fa3; one that compiles FP16 or "
            f"softcap out rejects such calls)",
        )
        if cc[0] == 9:
            return CheckedOn((), assumed)
        return CheckedOn(
            (
                Reason(
                    code=ReasonCode.CHECK,
                    field="compute_capability",
                    expected="9.x",
                    actual=f"{cc[0]}.{cc[1]}",
                    detail="FA3 builds have sm90a kernels",
                ),
            ),
            assumed,
        )

    def _build_reasons(self, abi: FA3Abi, cc: tuple[int, int], problem: Problem) -> list[Reason]:
        """Why ``abi`` cannot serve ``problem`` on a device of capability ``cc``."""
        out: list[Reason] = []
        if cc[0] not in abi.cc_majors:
            majors = " | ".join(f"{m}.x" for m in abi.cc_majors)
            out.append(
                Reason(
                    code=ReasonCode.CHECK,
                    field="compute_capability",
                    expected=majors,
                    actual=f"{cc[0]}.{cc[1]}",
                    detail=f"{abi.label} has sm90a kernels" + (" and sm80" if abi.sm8x else " only"),
                )
            )
        if problem.dtype == "float16" and not abi.fp16:
            out.append(
                Reason(
                    code=ReasonCode.DTYPE,
                    field="dtype",
                    expected="bfloat16",
                    actual="float16",
                    detail=f"{abi.label} was built with FLASHATTENTION_DISABLE_FP16",
                )
            )
        if Feature.SOFTCAP in problem.features and not abi.softcap:
            why = "has no softcap keyword" if "softcap" not in abi.params else "was built with softcap compiled out"
            out.append(
                Reason(
                    code=ReasonCode.FEATURE,
                    field="softcap",
                    expected="an FA3 build with softcap",
                    actual="softcap > 0 requested",
                    detail=f"{abi.label} {why}",
                )
            )
        return out

    def __call__(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        abi = self._abi()
        q, sinks, return_lse = call.q, call.sinks, call.return_lse
        native = (
            sinks is not None and abi.sinks and sinks.shape[0] == 1 and call.sink_rescale == "fp32" and not return_lse
        )
        need_lse = return_lse or (sinks is not None and not native)
        kwargs: dict[str, Any] = {
            "q": q,
            "k": call.k,
            "v": call.v,
            "cu_seqlens_q": call.cu_seqlens_q,
            "cu_seqlens_k": call.cu_seqlens_k,
            "max_seqlen_q": call.max_seqlen_q,
            "max_seqlen_k": call.max_seqlen_k,
            "softmax_scale": call.softmax_scale,
            "causal": False,
        }
        cap = float(call.softcap)  # the op normalised it (>= 0); a build without softcap rejects any nonzero value
        if cap > 0:
            if not abi.softcap:
                raise NotImplementedError(f"{abi.label} cannot apply softcap={cap}: softcap is not in this build")
            kwargs["softcap"] = cap
        elif "softcap" in abi.params:
            kwargs["softcap"] = 0.0
        if "num_splits" in abi.params:
            kwargs["num_splits"] = 1  # no split-KV: one pass per row, deterministic, FA3's own default
        if native:
            assert sinks is not None
            kwargs["sinks"] = sinks[0].contiguous()  # [Hq] FP32 natural-log logits, as the kernel takes them
        if need_lse:
            kwargs[abi.lse_flag] = True
        result = abi.varlen(**kwargs)
        o, lse = self._unpack(result, q, need_lse, abi)
        if sinks is not None and not native:
            assert lse is not None
            o, lse = self.sink_correction.apply(o, lse, sinks, rescale=call.sink_rescale, return_lse=return_lse)
        return o, lse if return_lse else None

    @staticmethod
    def _unpack(result: Any, q: torch.Tensor, need_lse: bool, abi: FA3Abi) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not need_lse:
            o = result if isinstance(result, torch.Tensor) else result[0]
            lse = None
        else:
            if not (isinstance(result, (tuple, list)) and len(result) >= 2 and isinstance(result[1], torch.Tensor)):
                raise RuntimeError(
                    f"{abi.label}: {abi.lse_flag}=True returned {type(result).__name__}, "
                    "expected a tuple (out, lse, ...)"
                )
            o, lse = result[0], result[1]
            tq, hq = q.shape[0], q.shape[1]
            if tuple(lse.shape) != (hq, tq) or lse.dtype != torch.float32:
                raise RuntimeError(
                    f"{abi.label} returned LSE {list(lse.shape)} {lse.dtype}, expected the packed "
                    f"[Hq, Tq] = {[hq, tq]} torch.float32 layout"
                )
        if not isinstance(o, torch.Tensor) or o.shape != q.shape or o.dtype != q.dtype:
            got = f"{list(o.shape)} {o.dtype}" if isinstance(o, torch.Tensor) else type(o).__name__
            raise RuntimeError(f"{abi.label} returned out {got}, expected {list(q.shape)} {q.dtype}")
        return o, lse


fa3_attention = FA3Attention()
