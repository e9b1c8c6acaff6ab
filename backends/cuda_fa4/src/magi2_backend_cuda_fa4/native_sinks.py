"""MAGI-2's sinks as FA4's ``learnable_sink``, with the contract's answer for non-finite sinks.

The contract's sinks are FP32 ``[S, Hq]`` logits that join the softmax denominator only. Their sum
of exponentials is one logit per head, ``Ls[h] = logsumexp_n sinks[n, h]``, which is exactly FA4's
``learnable_sink`` (one natural-log logit per q head, not multiplied by the softmax scale, no value
vector; FA4 adds it to the denominator after the scores were scaled and soft-capped, so the cap
never touches it, as the contract requires). Where ``Ls`` is finite, or ``-inf`` (no sink mass),
FA4 gives the contract's output and LSE, including ``o = 0, lse = Ls`` for a row without keys.

Three cases need the adapter (traced through FA4's ``Softmax.finalize``):

* ``Ls = NaN``: FA4's row sum becomes NaN, it then skips the normalisation and writes the
  unnormalised accumulator. The contract's scale is 0 (``δ`` is NaN, forced to ``-inf``), so the
  kernel gets ``+inf`` instead, whose scale is 0 as well.
* ``Ls = +inf`` (or NaN turned ``+inf``) on a row without keys: FA4 computes ``inf - inf`` and
  writes ``lse = -inf``. The contract's LSE there is ``logaddexp(L, Ls) = Ls``.
* A finite ``Ls`` more than ~88.7 above a row's largest score (upstream's "large" sinks): FA4 adds
  ``exp(Ls - max)`` to the row sum in FP32, which overflows, so the row's output is 0 (the contract's
  is below FP32's smallest normal: within every tolerance) and its LSE ``+inf``. The contract's LSE
  ``logaddexp(L, Ls)`` is then ``Ls`` to FP32 rounding (``L - Ls < -88.7 + log(keys)``, and
  ``log1p(exp(-68))`` is far below one ULP of ``Ls >= 88``).

So the kernel gets :attr:`NativeSink.logit` and, when an LSE is returned, :func:`contract_lse`
puts ``Ls`` back on the heads whose sink is ``+inf`` or NaN and on the rows whose LSE overflowed
(without a host sync).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["NativeSink", "contract_lse", "native_sink"]

_INF = float("inf")


class NativeSink(NamedTuple):
    exact: torch.Tensor  # [Hq] FP32: Ls as the contract defines it (NaN and +-inf kept)
    logit: torch.Tensor  # [Hq] FP32, contiguous: what FA4 gets (NaN -> +inf)


def native_sink(sinks: torch.Tensor) -> NativeSink:
    """Reduce FP32 ``sinks [S, Hq]`` to FA4's one logit per head (S = 1 is a view, no reduction)."""
    exact = sinks[0] if sinks.shape[0] == 1 else torch.logsumexp(sinks, dim=0)
    # nan_to_num would clamp +-inf to the largest finite floats unless told to keep them.
    logit = torch.nan_to_num(exact, nan=_INF, posinf=_INF, neginf=-_INF)
    return NativeSink(exact, logit)


def contract_lse(lse: torch.Tensor, sink: NativeSink) -> torch.Tensor:
    """FA4's ``[Hq, Tq]`` LSE with ``Ls`` on the heads whose sink is ``+inf`` or NaN and on the rows whose
    row sum overflowed to an LSE of ``+inf`` (see the module doc)."""
    return torch.where((sink.logit == _INF)[:, None] | (lse == _INF), sink.exact[:, None], lse)
