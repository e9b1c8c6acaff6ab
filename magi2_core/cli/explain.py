"""``magi2 explain OP``: resolve a described problem (no tensors, no kernel) and show why."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from magi2_core.cli._output import print_json, say, usage_error

if TYPE_CHECKING:
    from magi2_core.model.plan import Plan
    from magi2_core.model.problem import Problem
    from magi2_core.model.virtual_device import VirtualDevice


def _known_op(op: str) -> str:
    """Refuse an unknown op while the arguments are parsed, before torch is imported."""
    from magi2_core.model.problem import OPS  # pydantic only

    if op not in OPS:
        raise typer.BadParameter(f"unknown op {op!r}; choose one of {', '.join(OPS)}")
    return op


_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16", "float": "float32"}


def explain(
    op: Annotated[
        str,
        typer.Argument(
            help="attention | moe_route | moe_experts | rmsnorm | mhc_pre | mhc_mix | qk_norm_rope | output_gate",
            callback=_known_op,
        ),
    ],
    device: Annotated[str, typer.Option(help="device type: cpu, cuda, musa, ...")] = "cpu",
    dtype: Annotated[str, typer.Option(help="activation dtype: bfloat16, float16, float32")] = "bfloat16",
    tokens: Annotated[int | None, typer.Option(help="query tokens (attention) or T")] = None,
    max_seqlen_q: Annotated[int | None, typer.Option(help="longest query segment")] = None,
    max_seqlen_k: Annotated[int | None, typer.Option(help="longest key segment (default: = q)")] = None,
    segments: Annotated[
        int, typer.Option(help="number of segments (of equal length unless --max-seqlen-q/k say otherwise)")
    ] = 1,
    head_dim: Annotated[int, typer.Option(help="attention (and qk_norm_rope, output_gate) head dim")] = 128,
    heads_q: Annotated[int, typer.Option(help="query heads (qk_norm_rope, output_gate: the heads H)")] = 24,
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
    modalities: Annotated[int, typer.Option(help="RMSNorm (mHC norm, q/k norm) modality groups")] = 1,
    patterns: Annotated[int, typer.Option(help="RMSNorm patterns P")] = 1,
    out_dtype: Annotated[
        str | None,
        typer.Option(
            help="RMSNorm, qk_norm_rope and output_gate output dtype, mhc_pre coefficient dtype (default: = dtype)"
        ),
    ] = None,
    streams: Annotated[int, typer.Option(help="mHC streams n")] = 4,
    stream_width: Annotated[int, typer.Option(help="mHC stream width D")] = 3072,
    rotary_dim: Annotated[int, typer.Option(help="qk_norm_rope rotated dims R of each head")] = 96,
    feature: Annotated[list[str] | None, typer.Option(help="ask for any feature by name (repeatable)")] = None,
    field: Annotated[
        list[str] | None,
        typer.Option(
            help="set any integer field of the op's problem, as NAME=VALUE (repeatable; wins over the options above)"
        ),
    ] = None,
    provider: Annotated[str | None, typer.Option(help="force a provider, as provider= would")] = None,
    device_name: Annotated[
        str | None,
        typer.Option(
            help="explain for this device (as torch names it, e.g. 'NVIDIA H200'), whether or not this host has it"
        ),
    ] = None,
    capability: Annotated[
        str | None,
        typer.Option(
            help="its compute capability, MAJOR.MINOR (default: from a profile naming the device, or a known name)"
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(help="resolve under this profile: a file, 'generic' or a shipped name, in place of MAGI2_PROFILE"),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Show which provider a call would get and why every other candidate was or was not chosen."""
    from magi2_core.cli._explain_fields import EXPLAIN_FIELDS, ExplainError
    from magi2_core.errors import ResolutionError
    from magi2_core.model.problem import OPS, Feature, Problem
    from magi2_core.ops import SPECS
    from magi2_core.profiles.described import describe_device
    from magi2_core.selection.resolver import resolve_problem
    from magi2_core.tools.report import present_device_types

    def reject(message: str) -> NoReturn:
        usage_error("explain", message, json_out=json_out)

    if op not in OPS:
        reject(f"unknown op {op!r}; choose one of {', '.join(OPS)}")
    known = _known_device_types()
    if device not in known:
        reject(f"unknown device type {device!r}; known here: {', '.join(sorted(known))}")
    dt = _DTYPES.get(dtype, dtype)
    floats = ("bfloat16", "float16", "float32")  # the activation dtypes every op's contract takes
    if dt not in floats:
        reject(f"--dtype {dtype}: the ops take {', '.join(floats)} activations (or bf16, fp16, fp32)")
    sizes = dict(
        tokens=tokens,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        segments=segments,
        head_dim=head_dim,
        heads_q=heads_q,
        heads_kv=heads_kv,
        moe_heads=moe_heads,
        experts=experts,
        top_k=top_k,
        hidden=hidden,
        intermediate=intermediate,
        width=width,
        modalities=modalities,
        patterns=patterns,
        streams=streams,
        stream_width=stream_width,
        rotary_dim=rotary_dim,
    )
    for name, value in sizes.items():
        least = 0 if name == "tokens" else 1  # zero tokens is a legal (empty) call
        if value is not None and value < least:
            reject(f"--{name.replace('_', '-')} must be at least {least}; got {value}")
    opts = dict(
        sizes,
        dtype=dt,
        dtype_names=_DTYPES,
        softcap=softcap,
        sinks=sinks,
        lse=lse,
        deterministic=deterministic,
        out_dtype=out_dtype,
    )
    feats = {Feature.COMPILING} if compiling else set()
    spec = SPECS[op]
    try:
        fields = EXPLAIN_FIELDS[op](opts, feats)
    except ExplainError as exc:
        reject(str(exc))
    # Generic escapes, so that a new feature or size field of an op needs no new option here.
    for feat in feature or ():
        if feat not in {f.value for f in Feature}:
            reject(f"unknown feature {feat!r}; known: {', '.join(f.value for f in Feature)}")
        feats.add(Feature(feat))
    for item in field or ():
        key, sep, text = item.partition("=")
        if not sep or key not in spec.int_fields or not text.strip().isdigit():
            reject(f"--field {item!r}: expected NAME=INT with NAME one of {', '.join(spec.int_fields)}")
        fields[key] = int(text)
    described: VirtualDevice | None = None
    if device_name is not None or capability is not None or profile is not None:
        try:
            described = describe_device(device, device_name, capability, profile)
        except ValueError as exc:
            reject(f"{exc} (--device-name, --capability, --profile)")
    problem = Problem(op=op, device_type=device, dtype=dt, features=frozenset(feats), **fields)
    try:
        res = resolve_problem(problem, provider, device=described)
    except ResolutionError as exc:
        if exc.resolution is None:  # an unknown provider name: nothing was resolved
            reject(str(exc))
        res = exc.resolution
    plan = _plan(res.problem, res.chosen, described)
    if json_out:
        data = res.model_dump(mode="json")
        if plan is not None:
            data["plan"] = plan.model_dump(mode="json")
        print_json(data)
    else:
        say(res.explain())
        if plan is not None:
            say(f"plan ({res.chosen}): {plan.describe()}\n  why: {plan.why}")
        if described is None and device not in present_device_types():
            say(
                f"note: there is no {device} device on this host, so every provider that needs one at "
                f"run time is rejected as unavailable; on a machine with one the choice may differ"
            )
    if not res.ok:
        raise typer.Exit(1)


def _plan(problem: Problem, chosen: str | None, described: VirtualDevice | None) -> Plan | None:
    """The chosen provider's plan for ``problem`` (on the ``described`` device, if any) when its kernel
    object is :class:`Planned` (:class:`PlannedOn`), else None."""
    from magi2_core.model.kernel import Planned, PlannedOn
    from magi2_core.selection.registry import get_registry

    loaded = get_registry().provider(problem.op, chosen) if chosen else None
    kernel = loaded.load()[0] if loaded is not None else None
    if described is not None:
        return kernel.plan_on(problem, described) if isinstance(kernel, PlannedOn) else None
    return kernel.plan(problem) if isinstance(kernel, Planned) else None


def _known_device_types() -> set[str]:
    """Device types torch knows, plus any that an installed provider declares (a plugin's own device)."""
    import torch

    from magi2_core.selection.registry import get_registry

    providers = get_registry().state().providers.values()
    declared = {d for op in providers for p in op for d in p.capability.device_types if d != "*"}
    torch_types = set()
    for name in ("cpu", "cuda", "musa", "xpu", "mps", "hip", "npu", "meta", "privateuseone"):
        try:
            torch_types.add(torch.device(name).type)
        except RuntimeError:  # not a device type of this torch build
            continue
    return declared | torch_types
