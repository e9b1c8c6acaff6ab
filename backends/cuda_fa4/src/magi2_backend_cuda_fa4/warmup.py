"""Compile the attention kernels a server will call before its first request.

FA4 is written in the CuTe DSL and compiled on first use of each configuration (about 2 s each on
an H200): dtype, head dim, GQA ratio, sink or not, each softcap value, LSE or not, whether the
longest query segment fits one 128-row tile, and whether there are more than 256 segments. Later
calls with the same configuration hit FA4's in-process cache. :func:`warmup` runs one call per
shape through the public ``magi2_core.attention``, so it builds whatever the resolver picks for that
shape (FA4, or FA3 and its Triton sink correction), and reports what each first call cost::

    from magi2_backend_cuda_fa4 import warmup
    for r in warmup([[32768], [8192] * 4, [256] * 16], heads_q=24, head_dim=128, sinks=1):
        print(r.segments, r.provider, f"{r.first_s:.2f} s then {r.cached_s * 1e3:.3f} ms")

To keep the compiled kernels across processes, FA4 has a persistent cache: see docs/fa4.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from magi2_core import backend as m2
from magi2_core.backend import SinkRescale

__all__ = ["WarmupRecord", "warmup"]


@dataclass(frozen=True)
class WarmupRecord:
    """One warmed shape: the provider the resolver chose and what the first and second calls took."""

    segments: tuple[int, ...]
    provider: str
    first_s: float  # first call, synchronised: includes any JIT compile
    cached_s: float  # the same call again, synchronised


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warmup(
    shapes: Iterable[Sequence[int]],
    *,
    heads_q: int = 24,
    heads_kv: int | None = None,
    head_dim: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    sinks: int = 1,
    softcap: float = 0.0,
    return_lse: bool = False,
    sink_rescale: SinkRescale = "fp32",
    provider: str | None = None,
    device: str | torch.device = "cuda",
) -> list[WarmupRecord]:
    """Call attention once per shape (a list of self-attention segment lengths) and time it twice.

    Pass the options the server will call with: each distinct configuration compiles its own
    kernel. ``sinks`` is the number of sink rows ``S`` (0: none); ``provider`` forces one, as in
    ``magi2_core.attention``. Inputs are random; nothing is kept.
    """
    dev = torch.device(device)
    hkv = heads_q if heads_kv is None else heads_kv
    records: list[WarmupRecord] = []
    for shape in shapes:
        lengths = tuple(int(n) for n in shape)
        if not lengths or min(lengths) < 0:
            raise ValueError(f"warmup: a shape is a non-empty list of segment lengths >= 0, got {list(shape)}")
        total = sum(lengths)
        q = torch.randn(total, heads_q, head_dim, device=dev).to(dtype)
        k = torch.randn(total, hkv, head_dim, device=dev).to(dtype)
        v = torch.randn(total, hkv, head_dim, device=dev).to(dtype)
        sink = torch.randn(sinks, heads_q, device=dev) if sinks else None
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=dev)
        longest = max(lengths)
        kw: dict[str, Any] = {
            "max_seqlen_q": longest,
            "max_seqlen_k": longest,
            "softcap": softcap,
            "sinks": sink,
            "return_lse": return_lse,
            "sink_rescale": sink_rescale,
            "provider": provider,
        }
        chosen = m2.resolve("attention", q, k, v, cu, cu, **kw).chosen
        times: list[float] = []
        for _ in range(2):
            _synchronize(dev)
            start = time.perf_counter()
            m2.attention(q, k, v, cu, cu, **kw)
            _synchronize(dev)
            times.append(time.perf_counter() - start)
        records.append(WarmupRecord(lengths, str(chosen), times[0], times[1]))
    return records
