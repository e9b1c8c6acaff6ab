"""``magi2 explain OP``: resolve a described problem (no tensors, no kernel) and show why."""

from __future__ import annotations

from typing import Annotated

import typer

from magi2_core.cli._output import console
from magi2_core.errors import ResolutionError
from magi2_core.problem import OPS, Feature, Problem
from magi2_core.resolver import resolve_problem

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16", "float": "float32"}


def explain(
    op: Annotated[str, typer.Argument(help="attention | moe_route | moe_experts | rmsnorm")],
    device: Annotated[str, typer.Option(help="device type: cpu, cuda, musa, ...")] = "cpu",
    dtype: Annotated[str, typer.Option(help="activation dtype: bfloat16, float16, float32")] = "bfloat16",
    tokens: Annotated[int | None, typer.Option(help="query tokens (attention) or T")] = None,
    max_seqlen_q: Annotated[int | None, typer.Option(help="longest query segment")] = None,
    max_seqlen_k: Annotated[int | None, typer.Option(help="longest key segment (default: = q)")] = None,
    segments: Annotated[int, typer.Option(help="number of segments")] = 1,
    head_dim: Annotated[int, typer.Option(help="attention head dim")] = 128,
    heads_q: Annotated[int, typer.Option(help="query heads")] = 24,
    heads_kv: Annotated[int | None, typer.Option(help="kv heads (default: = q heads)")] = None,
    softcap: Annotated[bool, typer.Option("--softcap", help="ask for a positive softcap")] = False,
    sinks: Annotated[bool, typer.Option("--sinks", help="ask for learned sinks")] = False,
    lse: Annotated[bool, typer.Option("--lse", help="ask for the LSE")] = False,
    deterministic: Annotated[bool, typer.Option("--deterministic")] = False,
    compiling: Annotated[bool, typer.Option("--compiling", help="as inside torch.compile")] = False,
    moe_heads: Annotated[int, typer.Option(help="MoE local heads")] = 3,
    experts: Annotated[int, typer.Option(help="experts per head")] = 256,
    top_k: Annotated[int, typer.Option(help="routes per token and head")] = 6,
    hidden: Annotated[int, typer.Option(help="MoE head width d")] = 256,
    intermediate: Annotated[int, typer.Option(help="expert intermediate size I")] = 1280,
    width: Annotated[int, typer.Option(help="RMSNorm width D")] = 3072,
    modalities: Annotated[int, typer.Option(help="RMSNorm modality groups")] = 1,
    patterns: Annotated[int, typer.Option(help="RMSNorm patterns P")] = 1,
    out_dtype: Annotated[str | None, typer.Option(help="RMSNorm output dtype (default: = dtype)")] = None,
    provider: Annotated[str | None, typer.Option(help="force a provider, as provider= would")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Show which provider a call would get and why every other candidate was or was not chosen."""
    if op not in OPS:
        raise typer.BadParameter(f"unknown op {op!r}; choose one of {', '.join(OPS)}", param_hint="OP")
    dt = _DTYPES.get(dtype, dtype)
    feats = {Feature.COMPILING} if compiling else set()
    fields: dict[str, object]
    if op == "attention":
        mq = max_seqlen_q if max_seqlen_q is not None else (tokens or 4096)
        mk = max_seqlen_k if max_seqlen_k is not None else mq
        hkv = heads_kv or heads_q
        feats |= {
            f
            for f, on in (
                (Feature.SOFTCAP, softcap),
                (Feature.SINKS, sinks),
                (Feature.LSE, lse),
                (Feature.DETERMINISTIC, deterministic),
                (Feature.GQA, hkv != heads_q),
            )
            if on
        }
        fields = dict(
            tokens=tokens or mq * segments,
            tokens_k=mk * segments,
            max_seqlen_q=mq,
            max_seqlen_k=mk,
            num_segments=segments,
            head_dim=head_dim,
            num_heads_q=heads_q,
            num_heads_kv=hkv,
        )
    elif op in ("moe_route", "moe_experts"):
        if deterministic:
            feats.add(Feature.DETERMINISTIC)
        fields = dict(
            tokens=tokens if tokens is not None else 4096,
            num_heads=moe_heads,
            num_experts=experts,
            top_k=top_k,
            hidden=hidden,
        )
        if op == "moe_experts":
            fields["intermediate"] = intermediate
    else:
        fields = dict(
            tokens=tokens if tokens is not None else 4096,
            width=width,
            num_modalities=modalities,
            num_patterns=patterns,
            out_dtype=_DTYPES.get(out_dtype or dt, out_dtype or dt),
        )
    problem = Problem(op=op, device_type=device, dtype=dt, features=frozenset(feats), **fields)
    try:
        res = resolve_problem(problem, provider)
    except ResolutionError as exc:
        if exc.resolution is None:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(2) from exc
        res = exc.resolution
    if json_out:
        print(res.model_dump_json(indent=2))
    else:
        console.print(res.explain(), highlight=False, markup=False)
    if not res.ok:
        raise typer.Exit(1)
