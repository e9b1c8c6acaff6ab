"""Entry point of magi2-backend-cuda-fa4: the FA4 attention descriptor (no kernel is imported here).

Priority 25: below FA3 (30), above Triton (20) and torch's varlen kernel (10). So:

* on Blackwell (cc 10.x) FA3's ``check`` fails (it has sm90 kernels only) and FA4 is the
  FlashAttention that serves the call;
* on Hopper FA3 keeps the calls it wins, and stands aside for FA4 with a sink on short packs: that
  rule belongs to FA3's descriptor (``fa3-fa4-sink-*`` in magi2-backend-cuda-fa3, present only
  where this backend and flash-attn-4 are installed), because it is FA3 that becomes ineligible.

What needs the kernel or the device (the import, the compute capability) is reported by the
kernel object's ``check``.
"""

from __future__ import annotations

from magi2_backend_cuda_fa4 import __version__
from magi2_backend_cuda_fa4.discovery import FA4Install, installed
from magi2_core.capability import Capability, Condition, Provenance, Rule
from magi2_core.hookspecs import BackendSpec, hookimpl
from magi2_core.problem import Feature

__all__ = ["HEAD_DIMS", "SHORT_WORK_LIMITS", "SHORT_WORK_RULES", "descriptor", "magi2_backend"]

# FA4 checks head dims per architecture: sm90 serves 8..256, sm100 8..128 (and 256 without sinks or
# softcap). The descriptor cannot see the device, so it claims what both serve with sinks and
# softcap, in the 16-byte alignment FA4 requires for 2-byte dtypes. MAGI-2 uses 128.
HEAD_DIMS = tuple(range(8, 129, 8))

# Where torch's own varlen kernel (provider torch_varlen) is expected to beat FA4 without sinks:
# FA4's host-side path (Python argument handling, a compile-cache lookup) is a fixed cost per call,
# like FA3's. The corners are FA3's measured ones (magi2-backend-cuda-fa3 SHORT_WORK_LIMITS, from
# benchmarks/results/attention_h200.json); without them FA4 would take the small sink-free calls
# that FA3's own rule sends to torch_varlen. benchmarks/attention_fa4.py times raw FA4 against torch
# varlen on these shapes to re-measure them. With a sink or a softcap FA4 stays (native sink, cap).
SHORT_WORK_LIMITS: tuple[tuple[int, int], ...] = ((2048, 1024), (4096, 256), (8192, 128), (16384, 64))
SHORT_WORK_MAX_HEADS = 24
_PROVENANCE = Provenance(
    kind="benchmark", source="benchmarks/results/attention_h200.json",
    note="FA3's measured fixed-cost corners (H200, bf16, 24 heads x 128), assumed for FA4; to be re-measured "
         "by benchmarks/attention_fa4.py (raw_fa4 vs raw_varlen), docs/fa4.md",
)  # fmt: skip


def _short_work_rule(tokens: int, max_seqlen_k: int) -> Rule:
    return Rule(
        id=f"fa4-short-work-{tokens}x{max_seqlen_k}",
        when=(Condition(field="tokens", op="le", value=tokens),
              Condition(field="max_seqlen_k", op="le", value=max_seqlen_k),
              Condition(field="num_heads_q", op="le", value=SHORT_WORK_MAX_HEADS),
              Condition(field="feature", op="not_in", value="sinks"),
              Condition(field="feature", op="not_in", value="softcap")),
        reason=(f"torch varlen_attn is faster than a FlashAttention call when the work is small (<= {tokens} "
                f"query tokens with key segments <= {max_seqlen_k}): the fixed per-call cost dominates"),
        provenance=_PROVENANCE,
    )  # fmt: skip


SHORT_WORK_RULES: tuple[Rule, ...] = tuple(_short_work_rule(t, m) for t, m in SHORT_WORK_LIMITS)


def descriptor(install: FA4Install | None) -> Capability:
    source = install.label if install is not None else "flash-attn-4 not installed"
    return Capability(
        op="attention", name="fa4", impl="magi2_backend_cuda_fa4.provider:fa4_attention",
        version=f"{__version__} ({source})", device_types=("cuda",), dtypes=("bfloat16", "float16"),
        head_dims=HEAD_DIMS,
        features=frozenset({Feature.SOFTCAP, Feature.SINKS, Feature.GQA, Feature.LSE, Feature.DETERMINISTIC,
                            Feature.COMPILING}),
        priority=25, rules=SHORT_WORK_RULES,
        description="FlashAttention-4 varlen (CuTe DSL, JIT), cc 9.x and 10.x; sinks native for sink_rescale='fp32', "
                    "through the fused correction for 'activation'",
    )  # fmt: skip


@hookimpl
def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-cuda-fa4", version=__version__, core_api=">=2.0,<3",
        providers=(descriptor(installed()),),
        description="MAGI-2 attention through FlashAttention-4 on NVIDIA Hopper and Blackwell",
    )  # fmt: skip
