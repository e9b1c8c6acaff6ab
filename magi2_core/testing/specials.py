"""Inputs with the special values upstream defines the results of: sink logits and router inputs.

:func:`sink_logits` draws the kinds of learned sinks vllm-omni's MAGI-2 sink tests use (finite, huge,
``±inf``); :func:`route_specials` plants the non-finite router inputs whose routes ``torch.topk``
defines. The conformance cases (:mod:`magi2_core.testing.op_cases`) and the backends' tests use both.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from magi2_core.testing.cases import randn

__all__ = ["ROUTE_SPECIALS", "SINK_KINDS", "RouteSpecial", "SinkKind", "route_specials", "sink_logits"]

SinkKind = Literal["normal", "large", "neg_inf", "pos_inf", "all_neg_inf"]
SINK_KINDS: tuple[SinkKind, ...] = ("normal", "large", "neg_inf", "pos_inf", "all_neg_inf")


def sink_logits(kind: SinkKind, n: int, heads: int, g: torch.Generator) -> torch.Tensor:
    """FP32 sinks ``[n, heads]`` of one of the kinds vllm-omni's MAGI-2 sink tests use; what each gives:

    * ``normal``: N(0, 2²) draws, comparable to the LSE of a few dozen keys;
    * ``large``: finite logits of magnitude 90 to 100 (beyond FP32 ``exp``'s range), positive on even
      heads (their output is tiny but not NaN), negative on odd heads (their output is as without sinks);
    * ``neg_inf``: normal, with ``-inf`` in the first row of the even heads: a ``-inf`` logit contributes
      nothing (with one row, those heads have no sink at all);
    * ``pos_inf``: normal, with ``+inf`` in the first row of head 0: that head's output is 0 and its
      LSE ``+inf``;
    * ``all_neg_inf``: every logit ``-inf``: the same output and LSE as no sinks.
    """
    out = randn(g, (n, heads), torch.float32, 2.0)
    if kind == "large":
        sign = torch.tensor([1.0 if h % 2 == 0 else -1.0 for h in range(heads)])
        out = sign * (90.0 + 2.5 * out.abs().clamp(max=4.0))
    elif kind == "neg_inf":
        out[0, 0::2] = -math.inf
    elif kind == "pos_inf":
        out[0, 0] = math.inf
    elif kind == "all_neg_inf":
        out.fill_(-math.inf)
    elif kind != "normal":
        raise ValueError(f"unknown sink kind {kind!r}; one of {', '.join(SINK_KINDS)}")
    return out


RouteSpecial = Literal["neg_inf_bias", "exhausted", "pos_inf_bias", "nan_logits"]
ROUTE_SPECIALS: tuple[RouteSpecial, ...] = ("neg_inf_bias", "exhausted", "pos_inf_bias", "nan_logits")


def route_specials(
    kind: RouteSpecial, x: torch.Tensor, bias: torch.Tensor, *, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies of router inputs ``x [T, Hl, d]``, ``bias [Hl·E]`` with the non-finite values whose routes
    upstream defines (``torch.topk`` of ``score + bias``); ``E > top_k`` and ``T >= 3`` expected:

    * ``neg_inf_bias``: ``-inf`` on every other expert of every head: never selected while a head has
      ``top_k`` other experts;
    * ``exhausted``: head 0 keeps ``top_k - 1`` finite biases, the others ``-inf``: its last pick is the
      lowest ``-inf`` expert id, and the ids stay distinct;
    * ``pos_inf_bias``: ``+inf`` on experts 1 and E-1 of the last head: picked first (lower id first);
    * ``nan_logits``: token 1 is ``+inf`` everywhere and token 2 has a ``+inf`` and a ``-inf`` feature on
      head 0, so their logits are NaN (``inf - inf``) or ``±inf`` by the signs of the router weights: NaN
      ranks first (in id order), ids stay in range. (Inputs with ``±inf`` rather than NaN, so that an
      unchanged input still compares equal to itself.)
    """
    hl = x.shape[1]
    e = bias.numel() // hl
    x, b = x.clone(), bias.clone().view(hl, e)
    if kind == "neg_inf_bias":
        b[:, 1::2] = -math.inf
    elif kind == "exhausted":
        b[0, top_k - 1 :] = -math.inf
    elif kind == "pos_inf_bias":
        b[-1, [1, e - 1]] = math.inf
    elif kind == "nan_logits":
        x[1] = math.inf
        x[2, 0, 0], x[2, 0, 1] = math.inf, -math.inf
    else:
        raise ValueError(f"unknown route special {kind!r}; one of {', '.join(ROUTE_SPECIALS)}")
    return x, b.view(-1)
