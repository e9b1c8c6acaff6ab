"""Entry point of magi2-backend-musa-mate: the ``mate`` descriptor only (nothing MUSA is imported).

Selection facts live here as data: MUSA only, BF16/FP16, the head dims, the features, and the
short-sequence floor as a :class:`~magi2_core.model.capability.Rule` with its provenance, so that
``magi2 explain`` shows why a short call went to the exact reference instead.
"""

from __future__ import annotations

from magi2_backend_musa_mate import __version__
from magi2_backend_musa_mate.platform import DEVICE_TYPE
from magi2_backend_musa_mate.settings import SETTINGS
from magi2_core.backend import BackendSpec, Capability, Condition, Feature, IntRange, Provenance, Rule

__all__ = ["MATE_ATTENTION", "SHORT_SEQUENCE_FLOOR", "SHORT_SEQUENCE_RULE", "magi2_backend"]

# Below this many query tokens in the longest segment, MATE is not used (see the rule's reason).
SHORT_SEQUENCE_FLOOR = 32

SHORT_SEQUENCE_RULE = Rule(
    id="mate-short-sequence",
    when=(Condition(field="max_seqlen_q", op="lt", value=SHORT_SEQUENCE_FLOOR),),
    reason="MATE fast-exp2 error accumulates over many tiny layers; the exact reference serves short sequences",
    provenance=Provenance(
        kind="upstream",
        source="vllm-project/vllm-omni#7307",
        note="_MUSA_FA3_MIN_TOKENS = 32; a later revision compares the longest query segment (max_seqlen_q), "
        "not the packed total; operators.md §2.8",
    ),
)

MATE_ATTENTION = Capability(
    op="attention",
    name="mate",
    impl="magi2_backend_musa_mate.provider:mate_attention",
    version=__version__,
    device_types=(DEVICE_TYPE,),
    dtypes=("bfloat16", "float16"),
    # 64 and 128 ran on an MTT S5000 upstream (#7307 hardware tests; MAGI-2 uses 128); 256 is in
    # MATE's prebuilt kernel table. Other sizes are rounded up inside MATE and were never run.
    head_dims=(64, 128, 256),
    # Empty keys go to the reference, as upstream (a kernel launch over no keys gains nothing).
    ranges=(IntRange(field="tokens_k", min=1),),
    features=frozenset(
        {Feature.SOFTCAP, Feature.SINKS, Feature.GQA, Feature.LSE, Feature.DETERMINISTIC, Feature.COMPILING}
    ),
    priority=30,
    rules=(SHORT_SEQUENCE_RULE,),
    description="MATE flash_attn_varlen_func (MUSA, torchada first), no native sinks; learned sinks by the "
    "FP32 LSE correction (promote, rescale, cast once)",
)


def magi2_backend() -> BackendSpec:
    return BackendSpec(
        name="magi2-backend-musa-mate",
        version=__version__,
        core_api=">=2.0,<3",
        providers=(MATE_ATTENTION,),
        settings=SETTINGS,
        description="MATE attention on Moore Threads MUSA GPUs",
    )
