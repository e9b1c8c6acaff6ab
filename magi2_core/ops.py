"""The public operators: validate, resolve (cached), run the chosen provider.

Eager calls go straight to the provider's kernel. Under ``torch.compile`` each public op is recorded
as one opaque ``torch.library`` custom op (``magi2::attention`` ...): the fake implementation gives
the output shapes, and validation and resolution run when the compiled graph executes, outside the
traced graph, with the ``compiling`` feature set (providers that are not safe there are skipped).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, overload

import torch

from magi2_core import config
from magi2_core import shadow as _shadow
from magi2_core.contracts import attention as attn_c
from magi2_core.contracts import moe as moe_c
from magi2_core.contracts import rmsnorm as norm_c
from magi2_core.errors import InvalidValueError
from magi2_core.moe_weights import CHECKPOINT, PreparedMoEWeights, checkpoint_views, prepare_moe_weights
from magi2_core.problem import Problem
from magi2_core.provider import SinkRescale
from magi2_core.registry import get_registry
from magi2_core.resolution import Resolution
from magi2_core.resolver import Dispatcher, resolve_problem

__all__ = ["attention", "dispatcher", "moe_experts", "moe_route", "prepare_moe_weights", "resolve", "rmsnorm"]

_DISPATCHER: Dispatcher | None = None


def dispatcher() -> Dispatcher:
    """The process-wide memoised resolver used by the op calls."""
    global _DISPATCHER
    if _DISPATCHER is None:
        _DISPATCHER = Dispatcher(get_registry())
    return _DISPATCHER


def _compiling() -> bool:
    return bool(torch.compiler.is_compiling())


def _forward_only(op: str, **tensors: torch.Tensor | None) -> None:
    """No provider implements backward: refuse a tensor that asks for gradients instead of dropping them."""
    for arg, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            raise InvalidValueError(
                op, arg, "a tensor that does not require grad (magi2 ops are forward-only: call them under "
                "torch.no_grad() or torch.inference_mode(), or pass .detach())", "requires_grad=True")


def _dense(t: torch.Tensor) -> torch.Tensor:
    """What the fake implementations promise under torch.compile: a contiguous result (a provider may
    return x's strides for a non-contiguous x; the copy happens only then, and only in compiled graphs)."""
    return t if t.is_contiguous() else t.contiguous()


# ---------------------------------------------------------------------------------------------
# attention
# ---------------------------------------------------------------------------------------------
@overload
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    max_seqlen_q: int | None = ...,
    max_seqlen_k: int | None = ...,
    softmax_scale: float | None = ...,
    softcap: float = ...,
    sinks: torch.Tensor | None = ...,
    deterministic: bool = ...,
    return_lse: Literal[False] = ...,
    sink_rescale: SinkRescale = ...,
    provider: str | None = ...,
) -> torch.Tensor: ...
@overload
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    max_seqlen_q: int | None = ...,
    max_seqlen_k: int | None = ...,
    softmax_scale: float | None = ...,
    softcap: float = ...,
    sinks: torch.Tensor | None = ...,
    deterministic: bool = ...,
    return_lse: Literal[True],
    sink_rescale: SinkRescale = ...,
    provider: str | None = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    softmax_scale: float | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    deterministic: bool = False,
    return_lse: bool = False,
    sink_rescale: SinkRescale = "fp32",
    provider: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen attention with learned sinks: ``o [Tq, Hq, D]`` (and ``lse [Hq, Tq]`` FP32).

    Non-causal, block-diagonal over the segments of ``cu_seqlens_q``/``cu_seqlens_k`` (int32/int64
    prefix sums ``[B+1]``), GQA when ``Hq`` is a multiple of ``Hkv``. ``softcap <= 0`` disables the
    cap. ``sinks`` FP32 ``[S, Hq]`` are extra softmax logits (never rounded to the activation dtype).
    ``sink_rescale``: ``"fp32"`` (promote, rescale, cast once) or ``"activation"`` (scale cast to
    q's dtype first, as upstream CUDA MAGI-2). Pass ``max_seqlen_*`` to avoid a host sync when the
    prefix sums live on the GPU.
    """
    if torch.is_grad_enabled():
        _forward_only("attention", q=q, k=k, v=v, sinks=sinks)
    if torch.compiler.is_compiling():
        o, lse = torch.ops.magi2.attention(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            softmax_scale,
            float(softcap),
            sinks,
            deterministic,
            sink_rescale,
            provider,
        )
        return (o, lse) if return_lse else o
    result: torch.Tensor | tuple[torch.Tensor, torch.Tensor] = _attention(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        softcap,
        sinks,
        deterministic,
        return_lse,
        sink_rescale,
        provider,
        compiling=False,
    )
    return result


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float | None,
    softcap: float,
    sinks: torch.Tensor | None,
    deterministic: bool,
    return_lse: bool,
    sink_rescale: str,
    provider: str | None,
    *,
    compiling: bool,
) -> Any:
    call = attn_c.validate(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=softmax_scale,
        softcap=softcap,
        sinks=sinks,
        sink_rescale=sink_rescale,
        deterministic=deterministic,
        return_lse=return_lse,
        compiling=compiling,
    )
    kernel = dispatcher().kernel("attention", call.raw, attn_c.KEY_FIELDS, attn_c.problem_from_raw, provider)
    o, lse = kernel(
        call.q,
        call.k,
        call.v,
        call.cu_seqlens_q,
        call.cu_seqlens_k,
        max_seqlen_q=call.max_seqlen_q,
        max_seqlen_k=call.max_seqlen_k,
        softmax_scale=call.softmax_scale,
        softcap=call.softcap,
        sinks=call.sinks,
        sink_rescale=call.sink_rescale,
        deterministic=call.deterministic,
        return_lse=call.return_lse,
    )
    if _shadow.ACTIVE:
        _shadow.observe("attention", kernel, call, (o, lse))
    return (o, lse) if return_lse else o


@torch.library.custom_op("magi2::attention", mutates_args=())
def _attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float | None,
    softcap: float,
    sinks: torch.Tensor | None,
    deterministic: bool,
    sink_rescale: str,
    provider: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = _attention(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        softcap,
        sinks,
        deterministic,
        True,
        sink_rescale,
        provider,
        compiling=True,
    )
    return _dense(o), _dense(lse)


@_attention_op.register_fake
def _(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float | None,
    softcap: float,
    sinks: torch.Tensor | None,
    deterministic: bool,
    sink_rescale: str,
    provider: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# MoE
# ---------------------------------------------------------------------------------------------
def moe_route(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    top_k: int = 6,
    route_scale: float = 4.9,
    route_norm: bool = True,
    score_func: moe_c.ScoreFunc = "sigmoid",
    provider: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Head-routed top-k: ``probs [Hl, T, K]`` FP32 and per-head expert ids ``[Hl, T, K]``.

    ``x [T, Hl, d]``; ``router_weight`` FP32 ``[Hl·E, d]`` head-major; ``bias`` FP32 ``[Hl·E]``
    shifts the selection only. Scores are ``sigmoid`` (MAGI-2's release) or ``softmax`` over each
    head's experts. The ids are the ``top_k`` largest biased scores in descending order, equal scores
    in ascending expert id. Weights are the unbiased scores of the selected experts, L1-normalised
    (eps 1e-12) unless ``route_norm=False``, times ``route_scale``.
    """
    if torch.is_grad_enabled():
        _forward_only("moe_route", x=x, router_weight=router_weight, bias=bias)
    if torch.compiler.is_compiling():
        probs, idx = torch.ops.magi2.moe_route(
            x, router_weight, bias, top_k, float(route_scale), route_norm, score_func, provider
        )
        return probs, idx
    return _moe_route(x, router_weight, bias, top_k, route_scale, route_norm, score_func, provider, compiling=False)


def _moe_route(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor | None,
    top_k: int,
    route_scale: float,
    route_norm: bool,
    score_func: str,
    provider: str | None,
    *,
    compiling: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    call = moe_c.validate_route(
        x,
        router_weight,
        bias,
        top_k=top_k,
        route_scale=route_scale,
        route_norm=route_norm,
        score_func=score_func,
        compiling=compiling,
    )
    kernel = dispatcher().kernel("moe_route", call.raw, moe_c.ROUTE_KEY_FIELDS, _route_problem, provider)
    probs, idx = kernel(
        call.x,
        call.router_weight,
        call.bias,
        top_k=call.top_k,
        route_scale=call.route_scale,
        route_norm=call.route_norm,
        score_func=call.score_func,
    )
    if _shadow.ACTIVE:
        _shadow.observe("moe_route", kernel, call, (probs, idx))
    return probs, idx


def _route_problem(raw: tuple[object, ...]) -> Problem:
    return moe_c.problem_from_raw("moe_route", raw)


def _experts_problem(raw: tuple[object, ...]) -> Problem:
    return moe_c.problem_from_raw("moe_experts", raw)


@torch.library.custom_op("magi2::moe_route", mutates_args=())
def _moe_route_op(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor | None,
    top_k: int,
    route_scale: float,
    route_norm: bool,
    score_func: str,
    provider: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    probs, idx = _moe_route(
        x, router_weight, bias, top_k, route_scale, route_norm, score_func, provider, compiling=True
    )
    return _dense(probs), _dense(idx)


@_moe_route_op.register_fake
def _(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor | None,
    top_k: int,
    route_scale: float,
    route_norm: bool,
    score_func: str,
    provider: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (x.shape[1], x.shape[0], top_k)
    return x.new_empty(shape, dtype=torch.float32), x.new_empty(shape, dtype=torch.int64)


def moe_experts(
    x: torch.Tensor,
    probs: torch.Tensor,
    idx: torch.Tensor,
    w_gate: torch.Tensor | PreparedMoEWeights,
    w_up: torch.Tensor | None = None,
    w_down: torch.Tensor | None = None,
    *,
    deterministic: bool | None = None,
    provider: str | None = None,
) -> torch.Tensor:
    """Routed experts with SwiGLU7: ``x [T, Hl, d] -> y [T, Hl, d]`` in x's dtype.

    ``w_gate``/``w_up`` ``[Hl·E, d, I]``, ``w_down`` ``[Hl·E, I, d]``, or one
    :class:`~magi2_core.moe_weights.PreparedMoEWeights` from :func:`prepare_moe_weights` in their place;
    ``probs``/``idx`` as returned by :func:`moe_route`. ``deterministic=None`` reads
    ``MAGI2_DETERMINISTIC=1`` from the environment.
    """
    det = config.get("MAGI2_DETERMINISTIC") if deterministic is None else bool(deterministic)
    layout, weights = _weights_arg(w_gate, w_up, w_down)
    if torch.is_grad_enabled():
        names = ("w_gate", "w_up", "w_down") if layout == CHECKPOINT else [f"w_gate.tensors[{i}]" for i in range(3)]
        _forward_only("moe_experts", x=x, probs=probs, **dict(zip(names, weights, strict=False)))
    if torch.compiler.is_compiling():
        y: torch.Tensor = torch.ops.magi2.moe_experts(x, probs, idx, list(weights), layout, det, provider)
        return y
    return _moe_experts(x, probs, idx, layout, weights, det, provider, compiling=False)


def _weights_arg(w_gate: object, w_up: object, w_down: object) -> tuple[str, tuple[torch.Tensor, ...]]:
    """The weights as (layout, tensors): what the custom op can carry through a compiled graph."""
    if isinstance(w_gate, PreparedMoEWeights):
        if w_up is not None or w_down is not None:
            raise InvalidValueError(
                "moe_experts", "w_up/w_down", "omitted when w_gate is a PreparedMoEWeights", "tensors"
            )
        return w_gate.layout, w_gate.tensors
    return CHECKPOINT, (w_gate, w_up, w_down)  # type: ignore[return-value]  # validated below


def _moe_experts(
    x: torch.Tensor,
    probs: torch.Tensor,
    idx: torch.Tensor,
    layout: str,
    weights: Sequence[torch.Tensor],
    deterministic: bool,
    provider: str | None,
    *,
    compiling: bool,
) -> torch.Tensor:
    w_gate, w_up, w_down = checkpoint_views(layout, tuple(weights))
    call = moe_c.validate_experts(x, probs, idx, w_gate, w_up, w_down, deterministic=deterministic, compiling=compiling)
    kernel = dispatcher().kernel("moe_experts", call.raw, moe_c.EXPERTS_KEY_FIELDS, _experts_problem, provider)
    # Only providers that declare the feature are resolved for deterministic calls, and only they
    # receive the keyword (providers without it keep the plain signature).
    kw = {"deterministic": True} if deterministic else {}
    out: torch.Tensor = kernel(call.x, call.probs, call.idx, call.w_gate, call.w_up, call.w_down, **kw)
    if _shadow.ACTIVE:
        _shadow.observe("moe_experts", kernel, call, out)
    return out


@torch.library.custom_op("magi2::moe_experts", mutates_args=())
def _moe_experts_op(
    x: torch.Tensor,
    probs: torch.Tensor,
    idx: torch.Tensor,
    weights: list[torch.Tensor],
    layout: str,
    deterministic: bool,
    provider: str | None,
) -> torch.Tensor:
    return _dense(_moe_experts(x, probs, idx, layout, weights, deterministic, provider, compiling=True))


@_moe_experts_op.register_fake
def _(
    x: torch.Tensor,
    probs: torch.Tensor,
    idx: torch.Tensor,
    weights: list[torch.Tensor],
    layout: str,
    deterministic: bool,
    provider: str | None,
) -> torch.Tensor:
    return x.new_empty(x.shape)


# ---------------------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------------------
def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float = norm_c.DEFAULT_EPS,
    modality_sizes: Sequence[int] | None = None,
    out_dtype: torch.dtype | None = None,
    provider: str | None = None,
) -> torch.Tensor:
    """Multi-modality RMSNorm: ``x·rsqrt(mean(x²)+eps)·(w[m]+1)`` in FP32, cast once.

    ``x [T, D]`` or ``[T, ..., P, D]``; ``weight [M, P, D]`` (or flat ``[M·P·D]``) delta-scale;
    ``modality_sizes``: host-side sizes of the M contiguous token groups (None: one modality).
    """
    if torch.is_grad_enabled():
        _forward_only("rmsnorm", x=x, weight=weight)
    if torch.compiler.is_compiling():
        sizes = None if modality_sizes is None else list(modality_sizes)
        y: torch.Tensor = torch.ops.magi2.rmsnorm(x, weight, float(eps), sizes, out_dtype, provider)
        return y
    return _rmsnorm(x, weight, eps, modality_sizes, out_dtype, provider, compiling=False)


def _rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    modality_sizes: Sequence[int] | None,
    out_dtype: torch.dtype | None,
    provider: str | None,
    *,
    compiling: bool,
) -> torch.Tensor:
    call = norm_c.validate(x, weight, eps=eps, modality_sizes=modality_sizes, out_dtype=out_dtype, compiling=compiling)
    kernel = dispatcher().kernel("rmsnorm", call.raw, norm_c.KEY_FIELDS, norm_c.problem_from_raw, provider)
    out: torch.Tensor = kernel(
        call.x, call.weight, eps=call.eps, modality_sizes=call.modality_sizes, out_dtype=call.out_dtype
    )
    if _shadow.ACTIVE:
        _shadow.observe("rmsnorm", kernel, call, out)
    return out


@torch.library.custom_op("magi2::rmsnorm", mutates_args=())
def _rmsnorm_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    modality_sizes: list[int] | None,
    out_dtype: torch.dtype | None,
    provider: str | None,
) -> torch.Tensor:
    return _dense(_rmsnorm(x, weight, eps, modality_sizes, out_dtype, provider, compiling=True))


@_rmsnorm_op.register_fake
def _(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    modality_sizes: list[int] | None,
    out_dtype: torch.dtype | None,
    provider: str | None,
) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=out_dtype or x.dtype)


# ---------------------------------------------------------------------------------------------
# resolve (no kernel runs)
# ---------------------------------------------------------------------------------------------
def _problem(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Problem:
    kw = dict(kwargs)
    kw.pop("provider", None)
    if op == "attention":
        a = attn_c.validate(
            *args,
            max_seqlen_q=kw.pop("max_seqlen_q", None),
            max_seqlen_k=kw.pop("max_seqlen_k", None),
            softmax_scale=kw.pop("softmax_scale", None),
            softcap=kw.pop("softcap", 0.0),
            sinks=kw.pop("sinks", None),
            sink_rescale=kw.pop("sink_rescale", "fp32"),
            deterministic=kw.pop("deterministic", False),
            return_lse=kw.pop("return_lse", False),
            compiling=False,
            **kw,
        )
        return attn_c.problem_from_raw(a.raw)
    if op == "moe_route":
        r = moe_c.validate_route(
            *args,
            top_k=kw.pop("top_k", 6),
            route_scale=kw.pop("route_scale", 4.9),
            route_norm=kw.pop("route_norm", True),
            score_func=kw.pop("score_func", "sigmoid"),
            compiling=False,
            **kw,
        )
        return moe_c.problem_from_raw("moe_route", r.raw)
    if op == "moe_experts":
        det = kw.pop("deterministic", None)
        det = config.get("MAGI2_DETERMINISTIC") if det is None else bool(det)
        x, probs, idx, *w = args
        w.extend(kw.pop(n, None) for n in ("w_gate", "w_up", "w_down")[len(w) :])
        wg, wu, wd = checkpoint_views(*_weights_arg(*w))
        e = moe_c.validate_experts(x, probs, idx, wg, wu, wd, deterministic=det, compiling=False, **kw)
        return moe_c.problem_from_raw("moe_experts", e.raw)
    if op == "rmsnorm":
        n = norm_c.validate(
            *args,
            eps=kw.pop("eps", norm_c.DEFAULT_EPS),
            modality_sizes=kw.pop("modality_sizes", None),
            out_dtype=kw.pop("out_dtype", None),
            compiling=False,
            **kw,
        )
        return norm_c.problem_from_raw(n.raw)
    raise InvalidValueError("resolve", "op", "'attention', 'moe_route', 'moe_experts' or 'rmsnorm'", repr(op))


def resolve(op: str, *args: Any, **kwargs: Any) -> Resolution:
    """Resolve the call ``op(*args, **kwargs)`` without running a kernel; return its :class:`Resolution`.

    Takes the op's own arguments (including ``provider=``); raises the op's input errors, and a
    :class:`~magi2_core.errors.ResolutionError` carrying the Resolution when nothing can serve it.
    """
    problem = _problem(op, args, kwargs)
    return resolve_problem(problem, kwargs.get("provider"))
