"""The :class:`~magi2_core.model.problem.Problem` fields that ``magi2 explain``'s options describe, per op.

Each function takes the command's options (a mapping by option name) and the features asked for so
far (it adds the ones its options imply), and returns the op's integer problem fields; it raises
:class:`ExplainError` for an option combination that describes no valid call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from magi2_core.contracts import _checks as checks
from magi2_core.model.problem import Feature, OpName

__all__ = ["EXPLAIN_FIELDS", "ExplainError", "ExplainFields"]

ExplainFields = Callable[[Mapping[str, Any], set[Feature]], dict[str, Any]]


class ExplainError(ValueError):
    """A ``magi2 explain`` option combination that describes no valid call (the message says why)."""


def _attention(opts: Mapping[str, Any], features: set[Feature]) -> dict[str, Any]:
    # Segments of equal length unless --max-seqlen-* say otherwise; keys lay out like the queries
    # unless --max-seqlen-k is given. Zero tokens is an empty call, not the default size.
    tokens, segments, heads_q = opts["tokens"], opts["segments"], opts["heads_q"]
    if opts["max_seqlen_q"] is not None:
        mq = opts["max_seqlen_q"]
    else:
        mq = 4096 if tokens is None else -(-tokens // segments)
    tq = mq * segments if tokens is None else tokens
    if mq > tq:
        raise ExplainError(f"--max-seqlen-q {mq} exceeds --tokens {tq}")
    if mq * segments < tq:
        raise ExplainError(f"--tokens {tq} do not fit in --segments {segments} of at most --max-seqlen-q {mq}")
    mk = opts["max_seqlen_k"] if opts["max_seqlen_k"] is not None else mq
    tk = tq if opts["max_seqlen_k"] is None else mk * segments
    hkv = opts["heads_kv"] or heads_q
    if heads_q % hkv:
        raise ExplainError(
            f"--heads-q {heads_q} is not a multiple of --heads-kv {hkv} (grouped-query attention needs it)"
        )
    features |= {
        f
        for f, on in (
            (Feature.SOFTCAP, opts["softcap"]),
            (Feature.SINKS, opts["sinks"]),
            (Feature.LSE, opts["lse"]),
            (Feature.DETERMINISTIC, opts["deterministic"]),
            (Feature.GQA, hkv != heads_q),
        )
        if on
    }
    return dict(
        tokens=tq,
        tokens_k=tk,
        max_seqlen_q=mq,
        max_seqlen_k=mk,
        num_segments=segments,
        head_dim=opts["head_dim"],
        num_heads_q=heads_q,
        num_heads_kv=hkv,
    )


def _moe_route(opts: Mapping[str, Any], features: set[Feature]) -> dict[str, Any]:
    if opts["deterministic"]:
        features.add(Feature.DETERMINISTIC)
    if opts["top_k"] > opts["experts"]:
        raise ExplainError(
            f"--top-k {opts['top_k']} exceeds --experts {opts['experts']} (routes pick distinct experts)"
        )
    tokens = opts["tokens"]
    return dict(
        tokens=tokens if tokens is not None else 4096,
        num_heads=opts["moe_heads"],
        num_experts=opts["experts"],
        top_k=opts["top_k"],
        hidden=opts["hidden"],
    )


def _moe_experts(opts: Mapping[str, Any], features: set[Feature]) -> dict[str, Any]:
    return _moe_route(opts, features) | {"intermediate": opts["intermediate"]}


def _out_dtype(op: str, opts: Mapping[str, Any]) -> str:
    out: str = opts["dtype_names"].get(opts["out_dtype"], opts["out_dtype"]) or opts["dtype"]
    if out not in {checks.dtype_name(d) for d in checks.FLOATS}:
        raise ExplainError(
            f"--out-dtype {opts['out_dtype']}: {op} writes bfloat16, float16 or float32 "
            "(the call raises for any other out_dtype)"
        )
    return out


def _mhc_mix(opts: Mapping[str, Any], features: set[Feature]) -> dict[str, Any]:
    tokens = opts["tokens"]
    return dict(tokens=tokens if tokens is not None else 4096, num_streams=opts["streams"], hidden=opts["stream_width"])


def _mhc_pre(opts: Mapping[str, Any], features: set[Feature]) -> dict[str, Any]:
    return _mhc_mix(opts, features) | {"num_modalities": opts["modalities"], "out_dtype": _out_dtype("mhc_pre", opts)}


def _rmsnorm(opts: Mapping[str, Any], features: set[Feature]) -> dict[str, Any]:
    tokens, out = opts["tokens"], _out_dtype("rmsnorm", opts)
    return dict(
        tokens=tokens if tokens is not None else 4096,
        width=opts["width"],
        num_modalities=opts["modalities"],
        num_patterns=opts["patterns"],
        out_dtype=out,
    )


def _qk_norm_rope(opts: Mapping[str, Any], features: set[Feature]) -> dict[str, Any]:
    tokens, head_dim, rotary = opts["tokens"], opts["head_dim"], opts["rotary_dim"]
    if rotary % 2 or rotary > head_dim:
        raise ExplainError(f"--rotary-dim {rotary} must be even and at most --head-dim {head_dim}")
    return dict(
        tokens=tokens if tokens is not None else 4096,
        num_heads=opts["heads_q"],
        head_dim=head_dim,
        rotary_dim=rotary,
        num_modalities=opts["modalities"],
        out_dtype=_out_dtype("qk_norm_rope", opts),
    )


def _output_gate(opts: Mapping[str, Any], features: set[Feature]) -> dict[str, Any]:
    tokens = opts["tokens"]
    return dict(
        tokens=tokens if tokens is not None else 4096,
        num_heads=opts["heads_q"],
        head_dim=opts["head_dim"],
        out_dtype=_out_dtype("output_gate", opts),
    )


EXPLAIN_FIELDS: dict[OpName, ExplainFields] = {
    "attention": _attention,
    "moe_route": _moe_route,
    "moe_experts": _moe_experts,
    "rmsnorm": _rmsnorm,
    "mhc_pre": _mhc_pre,
    "mhc_mix": _mhc_mix,
    "qk_norm_rope": _qk_norm_rope,
    "output_gate": _output_gate,
}
