"""FA4 on a real GPU (cc 9.x or 10.x, flash-attn-4 installed): output and LSE against the FP32 reference.

Calls go through the public ``magi2_core.attention(..., provider="fa4")``; the non-finite sink and
empty-call cases are checked on the kernel object too. The reference is the exact provider: FP32
math, sinks by the contract's correction (``magi2_core.sink_correction.reference``), so the non-finite rules are its.
"""

from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

import pytest
import torch
from magi2_backend_reference.attention import reference_attention

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_attention, accept_lse
from magi2_core.testing import call_record
from magi2_core.testing.specials import SINK_KINDS, sink_logits

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))  # the float64 oracles of this monorepo
import oracles

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from magi2_backend_cuda_fa4.provider import CC_MAJORS, fa4_attention  # noqa: E402

if fa4_attention.loaded.abi is None:
    pytest.skip(f"no usable FA4 build: {fa4_attention.loaded.why_none()}", allow_module_level=True)
if torch.cuda.get_device_capability()[0] not in CC_MAJORS:
    pytest.skip(f"FA4 is served on cc {CC_MAJORS} only", allow_module_level=True)

D = 128
# an empty query segment, a key-less query segment (rows without keys), a longer one, and a tail past
# the H200 profile's short-work rows (where sink-free small work resolves to torch varlen)
TAIL = 1024 + 64
CU_Q = [0, 37, 37, 60, 360, 360 + TAIL]
CU_K = [0, 41, 50, 50, 380, 380 + TAIL]


def _inputs(cu_q: list[int], cu_k: list[int], hq: int, hkv: int, n_sinks: int, dtype: torch.dtype, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(cu_q[-1], hq, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(cu_k[-1], hkv, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(cu_k[-1], hkv, D, device="cuda", generator=g).to(dtype)
    # sinks near the rows' LSE (log of a few hundred keys) so that they change o materially
    sinks = (torch.randn(n_sinks, hq, device="cuda", generator=g) * 2 + 5).float() if n_sinks else None
    cq = torch.tensor(cu_q, dtype=torch.int32, device="cuda")
    ck = torch.tensor(cu_k, dtype=torch.int32, device="cuda")
    return q, k, v, cq, ck, sinks


def _lens(cu: list[int]) -> int:
    return max([b - a for a, b in itertools.pairwise(cu)], default=0)


def _reference(q, k, v, cq, ck, *, softcap, sinks, rescale):
    return reference_attention(
        call_record(
            "attention",
            q,
            k,
            v,
            cq,
            ck,
            max_seqlen_q=_lens(cq.tolist()),
            max_seqlen_k=_lens(ck.tolist()),
            softmax_scale=D**-0.5,
            softcap=softcap,
            sinks=sinks,
            sink_rescale=rescale,
            deterministic=False,
            return_lse=True,
        )
    )


def _kernel(q, k, v, cq, ck, sinks, *, softcap=0.0, rescale="fp32"):
    return fa4_attention(
        call_record(
            "attention",
            q,
            k,
            v,
            cq,
            ck,
            max_seqlen_q=_lens(cq.tolist()),
            max_seqlen_k=_lens(ck.tolist()),
            softmax_scale=D**-0.5,
            softcap=softcap,
            sinks=sinks,
            sink_rescale=rescale,
            deterministic=False,
            return_lse=True,
        )
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(("hq", "hkv"), [(6, 6), (6, 2)], ids=["mha", "gqa3"])
@pytest.mark.parametrize("softcap", [0.0, 2.0, -1.0], ids=["nocap", "cap2", "cap-1"])
@pytest.mark.parametrize("n_sinks", [0, 1, 2])
@pytest.mark.parametrize("rescale", ["fp32", "activation"])
def test_public_attention_matches_reference(registered, dtype, hq, hkv, softcap, n_sinks, rescale):
    if n_sinks == 0 and rescale == "activation":
        pytest.skip("the rescale mode matters only with sinks")
    for seed in (1, 2):
        q, k, v, cq, ck, sinks = _inputs(CU_Q, CU_K, hq, hkv, n_sinks, dtype, seed)
        sinks_before = None if sinks is None else sinks.clone()
        o, lse = m2.attention(
            q, k, v, cq, ck, softcap=softcap, sinks=sinks, sink_rescale=rescale, return_lse=True, provider="fa4"
        )
        ro, rlse = _reference(q, k, v, cq, ck, softcap=max(softcap, 0.0), sinks=sinks, rescale=rescale)
        assert accept_attention(o, ro), accept_attention(o, ro)
        assert accept_lse(lse, rlse, dtype), accept_lse(lse, rlse, dtype)  # the LSE includes the sinks
        assert o.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (hq, CU_Q[-1])
        assert torch.equal(o[37:60], torch.zeros_like(o[37:60]))  # rows without keys
        if sinks is not None:  # never mutated, never rounded
            assert torch.equal(sinks, sinks_before) and sinks.dtype == torch.float32
        o_only = m2.attention(q, k, v, cq, ck, softcap=softcap, sinks=sinks, sink_rescale=rescale, provider="fa4")
        assert accept_attention(o_only, ro), accept_attention(o_only, ro)


def test_softcap_with_a_large_sink_caps_only_the_scores():
    q, k, v, cq, ck, _ = _inputs(CU_Q, CU_K, 4, 4, 0, torch.bfloat16, 3)
    q = q * 4  # scores well past the cap
    sinks = torch.full((1, 4), 6.0, device="cuda")
    o, lse = _kernel(q, k, v, cq, ck, sinks, softcap=1.0)
    ro, rlse = _reference(q, k, v, cq, ck, softcap=1.0, sinks=sinks, rescale="fp32")
    assert accept_attention(o, ro) and accept_lse(lse, rlse, torch.bfloat16)
    capped = torch.full((1, 4), math.tanh(6.0), device="cuda")  # what capping the sink too would give
    assert not accept_attention(o, _reference(q, k, v, cq, ck, softcap=1.0, sinks=capped, rescale="fp32")[0])


@pytest.mark.parametrize("n_sinks", [1, 2])
def test_non_finite_sinks_follow_the_contract(n_sinks):
    q, k, v, cq, ck, _ = _inputs(CU_Q, CU_K, 4, 2, 0, torch.bfloat16, 4)
    # heads: NaN, +inf, no sink mass (-inf), finite; the second row mixes -inf and finite values
    sinks = torch.tensor([[math.nan, math.inf, -math.inf, 5.0], [4.0, 5.0, -math.inf, -math.inf]], device="cuda")[
        :n_sinks
    ].contiguous()
    o, lse = _kernel(q, k, v, cq, ck, sinks)
    ro, rlse = _reference(q, k, v, cq, ck, softcap=0.0, sinks=sinks, rescale="fp32")
    assert accept_attention(o, ro), accept_attention(o, ro)
    assert accept_lse(lse, rlse, torch.bfloat16), accept_lse(lse, rlse, torch.bfloat16)  # NaN/inf exactly where
    assert bool(torch.isfinite(o).all())


@pytest.mark.parametrize("empty", ["no-keys", "no-queries", "no-tokens"])
@pytest.mark.parametrize("n_sinks", [0, 1])
def test_a_call_without_keys_or_queries(empty, n_sinks):
    cu_q, cu_k = {"no-keys": ([0, 3, 70], [0, 0, 0]), "no-queries": ([0, 0, 0], [0, 4, 90]), "no-tokens": ([0], [0])}[
        empty
    ]
    q, k, v, cq, ck, sinks = _inputs(cu_q, cu_k, 4, 4, n_sinks, torch.bfloat16, 5)
    o, lse = _kernel(q, k, v, cq, ck, sinks)  # the kernel object itself, whatever resolution would pick
    ro, rlse = _reference(q, k, v, cq, ck, softcap=0.0, sinks=sinks, rescale="fp32")
    assert torch.equal(o, ro) and accept_lse(lse, rlse, torch.bfloat16), accept_lse(lse, rlse, torch.bfloat16)


def test_deterministic_repeat_is_bitwise_equal(registered):
    q, k, v, cq, ck, sinks = _inputs([0, 700, 3000], [0, 700, 3000], 8, 4, 1, torch.bfloat16, 6)
    a = m2.attention(q, k, v, cq, ck, sinks=sinks, deterministic=True, return_lse=True, provider="fa4")
    b = m2.attention(q, k, v, cq, ck, sinks=sinks, deterministic=True, return_lse=True, provider="fa4")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_resolution_on_this_device(registered):
    from magi2_backend_cuda_fa3.provider import fa3_attention

    from magi2_core.profiles import active_profile

    short = [0] + [256 * i for i in range(1, 17)]  # 16 x 256
    long = [0, 8192, 16384]
    sq, sk, sv, scq, sck, ssink = _inputs(short, short, 24, 24, 1, torch.bfloat16, 7)
    lq, lk, lv, lcq, lck, lsink = _inputs(long, long, 24, 24, 1, torch.bfloat16, 8)
    short_res = m2.resolve("attention", sq, sk, sv, scq, sck, sinks=ssink)
    long_res = m2.resolve("attention", lq, lk, lv, lcq, lck, sinks=lsink)
    fa3_runs = fa3_attention.loaded.abi is not None and torch.cuda.get_device_capability()[0] == 9
    if not fa3_runs:  # Blackwell, or no FA3 build: FA4 is the FlashAttention here
        assert short_res.chosen == "fa4" and long_res.chosen == "fa4", long_res.explain()
        return
    row = active_profile(sq.device).preference_for(short_res.problem)
    prefers_fa4 = row is not None and row.prefer[0] == "fa4"  # the H200 profile's short packs with a sink
    assert short_res.chosen == ("fa4" if prefers_fa4 else "fa3"), short_res.explain()
    assert long_res.chosen == "fa3", long_res.explain()


def test_torch_compile_matches_eager(registered):
    cu = [0, 100, 2148]
    q, k, v, cq, ck, sinks = _inputs(cu, cu, 8, 8, 1, torch.bfloat16, 9)
    kw = {"max_seqlen_q": 2048, "max_seqlen_k": 2048, "sinks": sinks, "provider": "fa4"}

    def f(q, k, v):
        return m2.attention(q, k, v, cq, ck, **kw)

    eager = f(q, k, v)
    compiled = torch.compile(f, fullgraph=True)(q, k, v)
    # compiled calls go through the core's custom op, which always asks for the LSE: FA4 then runs
    # its LSE-writing kernel variant, so the two outputs are compared at the contract's tolerance
    assert accept_attention(compiled, eager), accept_attention(compiled, eager)
    ro, _ = _reference(q, k, v, cq, ck, softcap=0.0, sinks=sinks, rescale="fp32")
    assert accept_attention(compiled, ro), accept_attention(compiled, ro)


def test_warmup_compiles_then_hits_the_cache(registered):
    from magi2_backend_cuda_fa4 import warmup

    (first,) = warmup([[300, 37]], heads_q=6, heads_kv=2, sinks=1, softcap=1.25, provider="fa4")
    (again,) = warmup([[300, 37]], heads_q=6, heads_kv=2, sinks=1, softcap=1.25, provider="fa4")
    assert first.provider == again.provider == "fa4"
    assert again.first_s < max(first.first_s, 0.05), (first, again)  # already compiled in this process


@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("kind", SINK_KINDS)
def test_upstream_sink_kinds(registered, kind, rescale, n_sinks):
    """Upstream's sink kinds through the public op: FA4's native sink (FP32) or FA4 + the CUDA sink
    correction (activation rescale); the LSE as upstream's correction gives it (large sinks included)."""
    q, k, v, cq, ck, _ = _inputs(CU_Q, CU_K, 4, 2, 0, torch.bfloat16, 12)
    sinks = sink_logits(kind, n_sinks, 4, torch.Generator().manual_seed(n_sinks)).cuda()
    o, lse = m2.attention(q, k, v, cq, ck, sinks=sinks, sink_rescale=rescale, return_lse=True, provider="fa4")
    ro, rlse = _reference(q, k, v, cq, ck, softcap=0.0, sinks=sinks, rescale=rescale)
    assert accept_attention(o, ro), accept_attention(o, ro)
    assert accept_lse(lse, rlse, torch.bfloat16), accept_lse(lse, rlse, torch.bfloat16)
    plain_o, plain_lse = _kernel(q, k, v, cq, ck, None, rescale=rescale)
    # FP32: the native sink is another kernel configuration, equal within the contract
    assert oracles.sink_kind_violations(o, lse, sinks, plain_o, plain_lse, exact=rescale != "fp32") == []
