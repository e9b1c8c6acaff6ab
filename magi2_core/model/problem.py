"""The problem a call poses: what the resolver matches capability descriptors against.

A :class:`Problem` is built from validated inputs (or from a CLI description, with no tensors).
It holds only what selection may depend on: device type, dtypes, sizes and the features asked for.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "COMMON_FIELDS",
    "FEATURE_BIT",
    "HEAD",
    "INT_FIELDS",
    "OPS",
    "OP_FEATURES",
    "OP_INT_FIELDS",
    "OUT_DTYPE_OPS",
    "Feature",
    "OpName",
    "Problem",
    "features_from_mask",
    "op_fields",
    "with_routes_per_expert",
]

OpName = Literal[
    "attention", "moe_route", "moe_experts", "rmsnorm", "mhc_pre", "mhc_mix", "qk_norm_rope", "output_gate"
]
OPS: tuple[OpName, ...] = (
    "attention",
    "moe_route",
    "moe_experts",
    "rmsnorm",
    "mhc_pre",
    "mhc_mix",
    "qk_norm_rope",
    "output_gate",
)


class Feature(str, Enum):
    """Optional behaviour a call asks for; a provider must declare each one it serves."""

    SOFTCAP = "softcap"
    SINKS = "sinks"
    GQA = "gqa"
    LSE = "lse"
    DETERMINISTIC = "deterministic"
    COMPILING = "compiling"
    # moe_route options other than the MAGI-2 release's sigmoid scores with L1-normalised weights
    ROUTE_SOFTMAX = "route_softmax"
    ROUTE_NO_NORM = "route_no_norm"


class Problem(BaseModel):
    """Everything provider selection may depend on, and nothing else.

    Integer fields that an operator does not use stay ``None``. ``tokens`` is the query token count
    for attention and the token count ``T`` for the MoE, RMSNorm and mHC operators.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    op: OpName
    device_type: str
    device_index: int | None = None  # the tensors' device index (a multi-GPU host may mix models)
    dtype: str
    features: frozenset[Feature] = frozenset()
    tokens: int | None = None
    # attention
    tokens_k: int | None = None
    max_seqlen_q: int | None = None
    max_seqlen_k: int | None = None
    num_segments: int | None = None
    head_dim: int | None = None
    num_heads_q: int | None = None
    num_heads_kv: int | None = None
    # moe
    num_heads: int | None = None
    num_experts: int | None = None
    top_k: int | None = None
    hidden: int | None = None
    intermediate: int | None = None
    # moe, derived: ceil(tokens * top_k / num_experts), the routes an expert receives on average. Only a
    # provider's plan rows read it (the Triton MoE's tiles follow it); the resolver leaves it None.
    routes_per_expert: int | None = None
    # rmsnorm
    width: int | None = None
    num_modalities: int | None = None
    num_patterns: int | None = None
    # rmsnorm, qk_norm_rope, output_gate: the output's dtype; mhc_pre: the post/residual coefficients'
    out_dtype: str | None = None
    # mhc (hidden: the stream width D; num_modalities: the mHC norm's weight groups)
    num_streams: int | None = None
    # qk_norm_rope (num_heads, head_dim, num_modalities as above): the rotated dims of each head
    rotary_dim: int | None = None


INT_FIELDS: tuple[str, ...] = tuple(
    name for name, field in Problem.model_fields.items() if field.annotation == (int | None)
)

_FEATURE_ORDER: tuple[Feature, ...] = tuple(Feature)
FEATURE_BIT: dict[Feature, int] = {f: 1 << i for i, f in enumerate(_FEATURE_ORDER)}


def features_from_mask(mask: int) -> frozenset[Feature]:
    """Inverse of OR-ing :data:`FEATURE_BIT` values (the hot path keeps features as an int)."""
    return frozenset(f for f in _FEATURE_ORDER if mask & FEATURE_BIT[f])


# -- the fields of each op's problem ---------------------------------------------------------
# The leading fields of every op's typed key (``magi2_core.ops``): device, dtype, out_dtype, feature mask.
HEAD = ("device", "dtype", "out_dtype", "features")
# Problem fields every op has (a descriptor or a profile row may name them whatever its op).
COMMON_FIELDS = frozenset({"op", "device_type", "device_index", "dtype", "features", "feature"})
# Each op's integer problem fields, in the order of its typed key after HEAD (the op's key type is
# checked against this when its spec is defined): what the dispatcher buckets and descriptors may name.
OP_INT_FIELDS: dict[OpName, tuple[str, ...]] = {
    "attention": (
        "tokens",
        "tokens_k",
        "max_seqlen_q",
        "max_seqlen_k",
        "num_segments",
        "head_dim",
        "num_heads_q",
        "num_heads_kv",
    ),
    "moe_route": ("tokens", "num_heads", "num_experts", "top_k", "hidden"),
    "moe_experts": ("tokens", "num_heads", "num_experts", "top_k", "hidden", "intermediate"),
    "rmsnorm": ("tokens", "width", "num_modalities", "num_patterns"),
    "mhc_pre": ("tokens", "num_streams", "hidden", "num_modalities"),
    "mhc_mix": ("tokens", "num_streams", "hidden"),
    "qk_norm_rope": ("tokens", "num_heads", "head_dim", "rotary_dim", "num_modalities"),
    "output_gate": ("tokens", "num_heads", "head_dim"),
}
_EVERY_OP = frozenset({Feature.DETERMINISTIC, Feature.COMPILING})
# The features a call of each op can ask for (what ``magi2 backends`` lists of a provider's features).
OP_FEATURES: dict[OpName, frozenset[Feature]] = {
    "attention": _EVERY_OP | {Feature.SOFTCAP, Feature.SINKS, Feature.GQA, Feature.LSE},
    "moe_route": _EVERY_OP | {Feature.ROUTE_SOFTMAX, Feature.ROUTE_NO_NORM},
    "moe_experts": _EVERY_OP,
    "rmsnorm": _EVERY_OP,
    "mhc_pre": _EVERY_OP,
    "mhc_mix": _EVERY_OP,
    "qk_norm_rope": _EVERY_OP,
    "output_gate": _EVERY_OP,
}
OUT_DTYPE_OPS: frozenset[OpName] = frozenset(
    {"rmsnorm", "mhc_pre", "qk_norm_rope", "output_gate"}
)  # the ops whose problem has an out_dtype


def op_fields(op: OpName) -> frozenset[str]:
    """Every :class:`Problem` field a descriptor or profile row of ``op`` may name."""
    extra = {"out_dtype"} if op in OUT_DTYPE_OPS else set()
    return COMMON_FIELDS | frozenset(OP_INT_FIELDS[op]) | extra


def with_routes_per_expert(problem: Problem) -> Problem:
    """``problem`` with ``routes_per_expert`` = ceil(tokens * top_k / num_experts) filled in: the derived
    field the MoE's plan rows are cut on (unchanged where it is set, or where a size is missing)."""
    t, k, e = problem.tokens, problem.top_k, problem.num_experts
    if problem.routes_per_expert is not None or t is None or k is None or not e:
        return problem
    return problem.model_copy(update={"routes_per_expert": -(-t * k // e)})
