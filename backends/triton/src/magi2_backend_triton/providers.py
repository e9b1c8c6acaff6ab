"""Kernel objects of the Triton providers: availability checks plus the call into the kernels.

Importing this module imports Triton; where Triton is missing the registry reports the providers as
unavailable with that import error (a reason, not a crash).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import triton

from magi2_backend_triton.interpret import interpreting
from magi2_backend_triton.mhc_mix import launch_mhc_mix
from magi2_backend_triton.mhc_pre import launch_mhc_pre
from magi2_backend_triton.moe import plan as moe_plan
from magi2_backend_triton.moe.fused import fused_moe_experts, run_plan
from magi2_backend_triton.moe.pack import pack_w13
from magi2_backend_triton.output_gate import launch_output_gate
from magi2_backend_triton.qk_norm_rope import launch_qk_norm_rope
from magi2_backend_triton.rmsnorm import launch_rmsnorm
from magi2_core.backend import CheckedOn, Plan, Problem, Reason, ReasonCode, VirtualDevice, absent_device

if TYPE_CHECKING:
    from magi2_core.backend import ExpertsCall, RMSNormCall

__all__ = [
    "TritonMoEExperts",
    "TritonRMSNorm",
    "TritonRecordKernel",
    "triton_mhc_mix",
    "triton_mhc_pre",
    "described_reasons",
    "device_reasons",
    "triton_moe_experts",
    "triton_output_gate",
    "triton_qk_norm_rope",
    "triton_rmsnorm_provider",
]


def device_reasons(device_type: str) -> list[Reason]:
    """Can Triton launch on this device type here? (CPU only through ``TRITON_INTERPRET=1``.)"""
    if device_type == "cpu":
        return _interpreter_reasons()
    return absent_device(device_type)


def _interpreter_reasons() -> list[Reason]:
    if interpreting():
        return []
    return [
        Reason(
            code=ReasonCode.UNAVAILABLE,
            field="TRITON_INTERPRET",
            expected="1 (interpreter on CPU)",
            actual="unset or not 1",
        )
    ]


def described_reasons(device: VirtualDevice) -> CheckedOn:
    """:func:`device_reasons` for a described device: Triton launches on any GPU it is installed for (this
    host's Triton is assumed), on the CPU through the interpreter."""
    return CheckedOn(tuple(_interpreter_reasons()) if device.type == "cpu" else ())


class TritonMoEExperts:
    """The fused head-routed MoE (GEMM1 + SwiGLU7, GEMM2 x routing weight, top-k sum).

    Implements :class:`magi2_core.model.kernel.Planned`: which kernel, tile and alignment serve a problem
    (`moe/plan.py`), the alternatives worth timing, and `run_plan` to run a call with one of them.
    """

    version = triton.__version__

    def check(self, problem: Problem) -> Sequence[Reason]:
        return device_reasons(problem.device_type)

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        return described_reasons(device)

    def plan(self, problem: Problem) -> Plan:
        """The plan a call of ``problem`` with prepared weights runs on this host's device of its type (raw
        gate/up run its raw-weights step, `moe.plan.without_bank`)."""
        device = moe_plan.device_id(problem.device_type, problem.device_index)
        return moe_plan.plan_for(problem, device, *moe_plan.rows_for(device))[0]

    def plan_on(self, problem: Problem, device: VirtualDevice) -> Plan:
        """The plan a call of ``problem`` would run on the described ``device``, with this host's Triton."""
        dev = moe_plan.described_id(device)
        return moe_plan.plan_for(problem, dev, *moe_plan.rows_for(dev, device.profile))[0]

    def plan_candidates(self, problem: Problem) -> Sequence[Plan]:
        """The plan first, then the other kernels, tiles and alignments of the device's rows that can run
        ``problem`` correctly here."""
        device = moe_plan.device_id(problem.device_type, problem.device_index)
        return moe_plan.candidates_for(problem, device, *moe_plan.rows_for(device))

    def run_plan(
        self,
        plan: Plan,
        x: torch.Tensor,
        probs: torch.Tensor,
        idx: torch.Tensor,
        w_gate: torch.Tensor,
        w_up: torch.Tensor,
        w_down: torch.Tensor,
        *,
        deterministic: bool = False,
    ) -> torch.Tensor:
        """A call with an explicit ``plan`` (one of `plan_candidates`); refused, with the reason, where the
        plan cannot run it correctly here."""
        return run_plan(x, probs, idx, w_gate, w_up, w_down, plan, deterministic=deterministic)

    def prepare_weights(
        self, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
    ) -> tuple[str, tuple[torch.Tensor, ...]]:
        """Pack gate/up once into the interleaved bank GEMM1 streams; w_down is read as stored."""
        return "w13_interleaved", (pack_w13(w_gate, w_up), w_down.contiguous())

    def __call__(self, call: ExpertsCall) -> torch.Tensor:
        return fused_moe_experts(
            call.x, call.probs, call.idx, call.w_gate, call.w_up, call.w_down, deterministic=call.deterministic
        )


class TritonRMSNorm:
    """One-pass multi-modality RMSNorm (FP32 math, one final cast)."""

    def check(self, problem: Problem) -> Sequence[Reason]:
        return device_reasons(problem.device_type)

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        return described_reasons(device)

    def __call__(self, call: RMSNormCall) -> torch.Tensor:
        return launch_rmsnorm(
            call.x, call.weight, eps=call.eps, modality_sizes=call.modality_sizes, out_dtype=call.out_dtype
        )


class TritonRecordKernel:
    """A fused kernel's provider object that takes the op's call record whole (``launch``:
    :func:`launch_mhc_pre`, :func:`launch_mhc_mix`, :func:`launch_qk_norm_rope` or :func:`launch_output_gate`)."""

    def __init__(self, launch: Callable[[Any], Any]) -> None:
        self._launch = launch

    def check(self, problem: Problem) -> Sequence[Reason]:
        return device_reasons(problem.device_type)

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        return described_reasons(device)

    def __call__(self, call: Any) -> Any:
        return self._launch(call)


triton_mhc_pre = TritonRecordKernel(launch_mhc_pre)
triton_mhc_mix = TritonRecordKernel(launch_mhc_mix)
triton_qk_norm_rope = TritonRecordKernel(launch_qk_norm_rope)
triton_output_gate = TritonRecordKernel(launch_output_gate)
triton_moe_experts = TritonMoEExperts()
triton_rmsnorm_provider = TritonRMSNorm()
