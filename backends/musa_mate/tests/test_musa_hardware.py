"""On an MTT S5000: MATE against the exact reference, and the short-sequence policy in a tiny model.

Shapes and tolerances are upstream's hardware tests (vllm-omni #7307 ``test_musa_attention.py``,
operators.md §2.9); the tolerances are the core's acceptance table, which holds the same
numbers (BF16 rtol 0.01/atol 0.015 — MATE's mubin kernel truncates probabilities — FP16
rtol 0.02/atol 0.003). Run on the MUSA machine with ``pytest -m musa backends/musa_mate/tests``.
Everywhere else these tests skip, saying what is missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from magi2_backend_musa_mate.mate_abi import load_mate_varlen
from magi2_backend_musa_mate.platform import musa_installed
from magi2_backend_musa_mate.provider import MateAttention, mate_attention

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_attention, accept_lse, rel_l2
from magi2_core.ops.attention import validate as validate_attention
from magi2_core.testing.specials import SINK_KINDS, SinkKind, sink_logits

pytestmark = pytest.mark.musa

DTYPES = (torch.float16, torch.bfloat16)


def _why_not_musa() -> str | None:
    if not musa_installed():
        return (
            "needs a Moore Threads GPU: torch.version.musa is unset and torch_musa is not installed "
            "(run on an MTT S5000 with torch_musa, torchada and MATE)"
        )
    mate = load_mate_varlen()  # imports torchada first, then torch_musa, then MATE
    if isinstance(mate, str):
        return f"MATE is not usable here: {mate}"
    if not (hasattr(torch, "musa") and torch.musa.is_available()):
        return "torch_musa is installed but no MUSA device is visible"
    return None


@pytest.fixture(scope="module")
def musa() -> str:
    why = _why_not_musa()
    if why is not None:
        pytest.skip(why)
    return "musa"


def _run_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, **kw: Any
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The contract's normalisation, then the MATE kernel object itself (bypassing resolution, as
    upstream's operator tests do by setting the short-sequence floor to 0)."""
    call = validate_attention(
        q,
        k,
        v,
        cu_q,
        cu_k,
        max_seqlen_q=None,
        max_seqlen_k=None,
        softmax_scale=None,
        softcap=kw.get("softcap", 0.0),
        sinks=kw.get("sinks"),
        sink_rescale="fp32",
        deterministic=False,
        return_lse=True,
        compiling=False,
    )
    return mate_attention(call)


@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("kind", SINK_KINDS)
def test_real_musa_mate_follows_the_upstream_sink_kinds(musa: str, kind: SinkKind, rescale: str) -> None:
    """Upstream's sink kinds (normal, large, -inf, +inf, all -inf) through the public op on MUSA."""
    g = torch.Generator().manual_seed(23)
    q = torch.randn(70, 4, 64, generator=g).to(torch.bfloat16)
    k = torch.randn(75, 2, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(75, 2, 64, generator=g).to(torch.bfloat16)
    cu_q = torch.tensor([0, 36, 70], dtype=torch.int32)  # segments past the 32-token MATE floor
    cu_k = torch.tensor([0, 40, 75], dtype=torch.int32)
    sinks = sink_logits(kind, 2, 4, g)
    kw: dict[str, Any] = {"sink_rescale": rescale, "return_lse": True}
    o_ref, lse_ref = m2.attention(q, k, v, cu_q, cu_k, sinks=sinks, provider="reference", **kw)
    o, lse = m2.attention(
        q.to(musa), k.to(musa), v.to(musa), cu_q.to(musa), cu_k.to(musa), sinks=sinks.to(musa), provider="mate", **kw
    )
    assert accept_attention(o.cpu(), o_ref), accept_attention(o.cpu(), o_ref)
    assert accept_lse(lse.cpu(), lse_ref, torch.bfloat16), accept_lse(lse.cpu(), lse_ref, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,kv_heads,sink_count,softcap", [(64, 4, 0, -1.0), (128, 2, 1, -1.0), (64, 2, 2, 2.0)])
def test_real_musa_mate_matches_sink_oracle(
    musa: str, dtype: torch.dtype, head_dim: int, kv_heads: int, sink_count: int, softcap: float
) -> None:
    g = torch.Generator().manual_seed(19)
    q = torch.randn(9, 4, head_dim, generator=g).to(dtype)
    k = torch.randn(11, kv_heads, head_dim, generator=g).to(dtype)
    v = torch.randn(11, kv_heads, head_dim, generator=g).to(dtype)
    cu_q = torch.tensor([0, 3, 9], dtype=torch.int64)
    cu_k = torch.tensor([0, 4, 11], dtype=torch.int64)
    sinks = None if not sink_count else torch.linspace(-1.98765, 2.12345, sink_count * 4).reshape(sink_count, 4)
    expected = m2.attention(q, k, v, cu_q, cu_k, softcap=softcap, sinks=sinks, provider="reference")
    sinks_dev = None if sinks is None else sinks.to(musa)
    actual, _ = _run_kernel(q.to(musa), k.to(musa), v.to(musa), cu_q, cu_k, softcap=softcap, sinks=sinks_dev)
    assert actual.device.type == "musa" and actual.dtype == dtype
    assert bool(torch.isfinite(actual).all())
    verdict = accept_attention(actual.cpu(), expected)
    assert verdict, verdict
    if sinks_dev is not None:
        assert sinks_dev.dtype == torch.float32 and torch.equal(sinks_dev.cpu(), sinks)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sink_count", [1, 2])
def test_real_musa_mate_matches_sink_oracle_across_tiles(musa: str, dtype: torch.dtype, sink_count: int) -> None:
    """Uneven segments longer than one tile, chosen by normal resolution (longest segment 263 >= 32)."""
    g = torch.Generator().manual_seed(23)
    q = torch.randn(300, 6, 128, generator=g).to(dtype)
    k = torch.randn(330, 6, 128, generator=g).to(dtype)
    v = torch.randn(330, 6, 128, generator=g).to(dtype)
    cu_q = torch.tensor([0, 37, 300], dtype=torch.int64)
    cu_k = torch.tensor([0, 41, 330], dtype=torch.int64)
    sinks = torch.linspace(-1.5, 2.5, sink_count * 6).reshape(sink_count, 6)
    expected = m2.attention(q, k, v, cu_q, cu_k, sinks=sinks, provider="reference")
    args = (q.to(musa), k.to(musa), v.to(musa), cu_q, cu_k)
    res = m2.resolve("attention", *args, sinks=sinks.to(musa))
    assert res.problem.device_type == "musa" and res.chosen == "mate", res.explain()
    actual = m2.attention(*args, sinks=sinks.to(musa))
    verdict = accept_attention(actual.cpu(), expected)
    assert verdict, verdict


@pytest.mark.parametrize("dtype", DTYPES)
def test_real_musa_gqa_lse_parity(musa: str, dtype: torch.dtype) -> None:
    """q[5,2,64] / k[7,1,64] (GQA 2:1), output and LSE against the reference (operators.md §2.9; upstream
    #7249's GPU parity case)."""
    g = torch.Generator().manual_seed(29)
    q = torch.randn(5, 2, 64, generator=g).to(dtype)
    k = torch.randn(7, 1, 64, generator=g).to(dtype)
    v = torch.randn(7, 1, 64, generator=g).to(dtype)
    cu_q = torch.tensor([0, 5], dtype=torch.int32)
    cu_k = torch.tensor([0, 7], dtype=torch.int32)
    o_ref, lse_ref = m2.attention(q, k, v, cu_q, cu_k, return_lse=True, provider="reference")
    o, lse = _run_kernel(q.to(musa), k.to(musa), v.to(musa), cu_q, cu_k)
    assert lse is not None and lse.shape == (2, 5) and lse.dtype == torch.float32
    out_ok, lse_ok = accept_attention(o.cpu(), o_ref), accept_lse(lse.cpu(), lse_ref, dtype)
    assert out_ok, out_ok
    assert lse_ok, lse_ok


def test_real_musa_tensor_is_musa_even_under_torchada(musa: str) -> None:
    """torchada may make ``is_cuda`` True; the problem's device type must still be musa."""
    q = torch.randn(64, 4, 128, device=musa).to(torch.bfloat16)
    kv = torch.randn(64, 2, 128, device=musa).to(torch.bfloat16)
    cu = torch.tensor([0, 64], dtype=torch.int32)
    res = m2.resolve("attention", q, kv, kv, cu, cu)
    assert q.device.type == "musa" and res.problem.device_type == "musa"
    assert res.chosen == "mate", res.explain()
    chosen = m2.get_registry().provider("attention", res.chosen)
    assert chosen is not None and "cuda" not in chosen.capability.device_types


class _TinyTransformer(torch.nn.Module):
    """Norm -> packed attention with sinks -> projection, with residuals: the MAGI-2 block shape in small."""

    def __init__(self, width: int = 128, heads: int = 2, layers: int = 2, seed: int = 119) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.heads, self.head_dim = heads, width // heads
        self.norm = torch.nn.ParameterList(
            [torch.nn.Parameter(0.1 * torch.randn(1, 1, width, generator=g)) for _ in range(layers)]
        )
        self.qkv = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(width, 3 * width, generator=g) / width**0.5) for _ in range(layers)]
        )
        self.proj = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(width, width, generator=g) / width**0.5) for _ in range(layers)]
        )
        self.sinks = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(1, heads, generator=g)) for _ in range(layers)]
        )

    def forward(self, x: torch.Tensor, cu: torch.Tensor) -> torch.Tensor:
        for norm, qkv, proj, sinks in zip(self.norm, self.qkv, self.proj, self.sinks, strict=True):
            # RMSNorm by the exact reference: this test is about the attention policy only.
            h = m2.rmsnorm(x, norm.float(), provider="reference")
            q, k, v = (h @ qkv.to(x.dtype)).unflatten(-1, (3, self.heads, self.head_dim)).unbind(1)
            o = m2.attention(q.contiguous(), k.contiguous(), v.contiguous(), cu, cu, sinks=sinks.float())
            x = x + o.flatten(1) @ proj.to(x.dtype)
        return x


def test_real_musa_tiny_transformer_uses_exact_short_sequence_fallback(
    musa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    original = MateAttention.__call__

    def spy(self: MateAttention, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(MateAttention, "__call__", spy)
    model = _TinyTransformer().to(musa)
    g = torch.Generator().manual_seed(13)
    with torch.no_grad():
        short = torch.randn(6, 128, generator=g).to(device=musa, dtype=torch.bfloat16)
        cu_short = torch.tensor([0, 6], dtype=torch.int32, device=musa)
        out = model(short, cu_short)
        assert calls == [], "MATE ran on a 6-token sequence"
        assert bool(torch.isfinite(out).all())
        cpu = _TinyTransformer()(short.cpu(), cu_short.cpu())
        assert rel_l2(out.cpu(), cpu) < 1e-2
        # Positive control: a 64-token sequence goes to MATE in every layer.
        long = torch.randn(64, 128, generator=g).to(device=musa, dtype=torch.bfloat16)
        out = model(long, torch.tensor([0, 64], dtype=torch.int32, device=musa))
        assert len(calls) == 2 and bool(torch.isfinite(out).all())


@pytest.fixture(autouse=True)
def _fresh_dispatch() -> Iterator[None]:
    """Spies patch the kernel class; clear the op cache so no test sees another's resolution."""
    from magi2_core.ops import dispatcher

    dispatcher().clear()
    yield
    dispatcher().clear()
