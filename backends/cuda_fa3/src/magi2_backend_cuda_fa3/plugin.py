"""Entry point of magi2-backend-cuda-fa3: the FA3 attention descriptor (no kernel is imported here).

The descriptor describes the installed build from its packaging alone (``discovery``): its version
string names the distribution, and its head dims follow the build's ``FLASHATTENTION_DISABLE_HDIM*``
flags. What needs the kernel or the device (compute capability, FP16 and softcap compiled out, a
MATE look-alike) is reported by the kernel object's ``check``.
"""

from __future__ import annotations

from magi2_backend_cuda_fa3 import __version__
from magi2_backend_cuda_fa3.discovery import FoundBuild, fa4_installed, installed_build
from magi2_core.capability import Capability, Condition, IntRange, Provenance, Rule
from magi2_core.hookspecs import BackendSpec, hookimpl
from magi2_core.problem import Feature

__all__ = ["FA4_SINK_LIMITS", "FA4_SINK_RULES", "SHORT_SEQUENCE_RULES", "SHORT_WORK_LIMITS", "descriptor", "dtypes",
           "head_dims", "magi2_backend"]

# FA3 rounds the head dim up to the next compiled class and needs a multiple of 8 (flash_api.cpp).
_HEAD_DIM_CLASSES = (64, 96, 128, 192, 256)

# Where torch's own varlen kernel (provider torch_varlen, priority 10) beats FA3: measured on the
# H200 (benchmarks/results/attention_h200.json, docs/fa3-notes.md). FA3 costs about 0.1 ms per call
# however small the problem (host-side wrapper, scheduler metadata), torch varlen_attn about 0.05 ms
# plus its work, so torch wins while the work (sum of Lq·Lk <= tokens · max_seqlen_k) is small.
# Each (tokens, max_seqlen_k) corner below was measured with torch ahead (2x1024, 16x256, 64x128,
# 256x64); 8x1024, 4096-token segments and up go to FA3. Single 1536/2048-token segments are a
# toss-up at this scale (~0.1-0.2 ms): three H200 runs disagreed on the faster provider (a widened
# (2048, 2048) corner was tried and measured in attention_h200_rule2048x2048.json), so they stay on FA3. The rules stand aside
# when torch_varlen would be slower or cannot serve the call: with sinks (its unfused torch sink
# correction costs ~0.2 ms of launches, FA3's fused one far less: FA3 won at every measured size),
# with a softcap (torch_varlen has none), and above the 24 heads measured (work grows with heads).
SHORT_WORK_LIMITS: tuple[tuple[int, int], ...] = ((2048, 1024), (4096, 256), (8192, 128), (16384, 64))
SHORT_WORK_MAX_HEADS = 24
_PROVENANCE = Provenance(
    kind="benchmark", source="benchmarks/results/attention_h200.json",
    note="short sweep, H200, bf16, 24 heads x 128: raw_varlen vs raw_fa3 and the resolved call; re-checked in "
         "attention_h200_final.json and attention_h200_rule2048x2048.json; docs/fa3-notes.md",
)  # fmt: skip


def _short_work_rule(tokens: int, max_seqlen_k: int) -> Rule:
    return Rule(
        id=f"fa3-short-work-{tokens}x{max_seqlen_k}",
        when=(Condition(field="tokens", op="le", value=tokens),
              Condition(field="max_seqlen_k", op="le", value=max_seqlen_k),
              Condition(field="num_heads_q", op="le", value=SHORT_WORK_MAX_HEADS),
              Condition(field="feature", op="not_in", value="sinks"),
              Condition(field="feature", op="not_in", value="softcap")),
        reason=(f"torch varlen_attn is faster than FA3 when the work is small (<= {tokens} query tokens with "
                f"key segments <= {max_seqlen_k}): FA3's fixed per-call cost dominates"),
        provenance=_PROVENANCE,
    )  # fmt: skip


SHORT_SEQUENCE_RULES: tuple[Rule, ...] = tuple(_short_work_rule(t, m) for t, m in SHORT_WORK_LIMITS)

# Where FlashAttention-4's native sink (provider fa4, magi2-backend-cuda-fa4) beats FA3 + the fused
# sink correction on Hopper: on short packs the correction's second launch is a fixed cost that FA4
# does not pay; on long packs FA4 is 1-3% slower than FA3 + correction. Thresholds are
# (query tokens, longest key segment) corners, at most 24 heads (work grows with heads). The rules
# exist only where the FA4 backend and flash-attn-4 are installed (``descriptor(..., fa4=True)``).
FA4_SINK_LIMITS: tuple[tuple[int, int], ...] = ((4096, 4096), (8192, 1024))
FA4_SINK_MAX_HEADS = 24
FA4_MAX_HEAD_DIM = 128  # the fa4 descriptor's largest head dim: above it FA3 keeps the call
_FA4_PROVENANCE = Provenance(
    kind="benchmark", source="benchmarks/results/attention_fa4_h200.json",
    note="initial corners from the H200 reference figures of FA4 4.0.0b36 (24 x 128 bf16, time / raw FA3: FA4 "
         "with a sink 1.36 / 1.14 / 1.02 / 1.09 at 16x256 / 8x1024 / [342] / [4096], FA3 + fused correction "
         "2.30 / 1.36 / 2.43 / 1.17; FA3 + correction 1-3% ahead at [8192]x4, [14601]x2, [32768]); to be "
         "re-measured by benchmarks/attention_fa4.py, which writes this file; docs/fa4.md",
)  # fmt: skip


def _fa4_sink_rule(tokens: int, max_seqlen_k: int) -> Rule:
    return Rule(
        id=f"fa3-fa4-sink-{tokens}x{max_seqlen_k}",
        when=(Condition(field="tokens", op="le", value=tokens),
              Condition(field="max_seqlen_k", op="le", value=max_seqlen_k),
              Condition(field="num_heads_q", op="le", value=FA4_SINK_MAX_HEADS),
              Condition(field="head_dim", op="le", value=FA4_MAX_HEAD_DIM),
              Condition(field="feature", op="in", value="sinks")),
        reason=(f"FlashAttention-4's native sink (provider fa4) is faster than FA3 + the sink correction on short "
                f"packs (<= {tokens} query tokens with key segments <= {max_seqlen_k}): the correction's launch "
                "dominates there"),
        provenance=_FA4_PROVENANCE,
    )  # fmt: skip


FA4_SINK_RULES: tuple[Rule, ...] = tuple(_fa4_sink_rule(t, m) for t, m in FA4_SINK_LIMITS)


def head_dims(build: FoundBuild | None) -> tuple[int, ...]:
    """Head dims the build serves: multiples of 8 up to its largest compiled class."""
    classes = [c for c in _HEAD_DIM_CLASSES if build is None or not build.disabled(f"HDIM{c}")]
    top = max(classes, default=0)
    return tuple(range(8, top + 1, 8))


def dtypes(build: FoundBuild | None) -> tuple[str, ...]:
    """Activation dtypes the build serves (fa3-fwd 0.0.3 compiles FP16 out: the conformance kit caught
    the over-claim on the H200 when FP16 was declared regardless)."""
    return ("bfloat16",) if build is not None and build.disabled("FP16") else ("bfloat16", "float16")


def descriptor(build: FoundBuild | None, *, fa4: bool = False) -> Capability:
    """The fa3 descriptor for ``build``; ``fa4``: the FA4 provider is installed (adds FA4_SINK_RULES)."""
    source = build.label if build is not None else "no FA3 build installed"
    return Capability(
        op="attention", name="fa3", impl="magi2_backend_cuda_fa3.provider:fa3_attention",
        version=f"{__version__} ({source})", device_types=("cuda",), dtypes=dtypes(build),
        head_dims=head_dims(build),
        ranges=(IntRange(field="tokens", min=1), IntRange(field="tokens_k", min=1)),
        features=frozenset({Feature.SOFTCAP, Feature.SINKS, Feature.GQA, Feature.LSE, Feature.DETERMINISTIC,
                            Feature.COMPILING}),
        priority=30, rules=SHORT_SEQUENCE_RULES + (FA4_SINK_RULES if fa4 else ()),
        description="FlashAttention-3 varlen (fa3-fwd, flash_attn_3 or tokenspeed-fa3) + the fused sink correction",
    )  # fmt: skip


@hookimpl
def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-cuda-fa3", version=__version__, core_api=">=2.0,<3",
        providers=(descriptor(installed_build(), fa4=fa4_installed()),),
        description="MAGI-2 attention through FlashAttention-3 on NVIDIA Hopper",
    )  # fmt: skip
