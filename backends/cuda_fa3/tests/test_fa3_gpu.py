"""FA3 on a real GPU (fa3-fwd or another build): output and LSE against the FP32 reference provider.

Everything runs through the public ``magi2_core.attention(..., provider="fa3")`` where the
descriptor allows it; the short ragged packs that the short-sequence rule sends to torch's varlen
kernel are checked on the kernel object directly (the rule is about speed, the kernel must still be
right) and their resolution is checked separately.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from magi2_backend_reference.attention import reference_attention

import magi2_core as m2
from magi2_core.contracts.acceptance import accept_attention, accept_lse
from magi2_core.errors import ProviderNotEligibleError
from magi2_core.reasons import ReasonCode
from magi2_core.testing import call_record
from magi2_core.testing.specials import SINK_KINDS, sink_logits

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))  # the float64 oracles of this monorepo
import oracles

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from magi2_backend_cuda_fa3.provider import fa3_attention  # noqa: E402

from magi2_core.profiles import active_profile, shipped_profiles  # noqa: E402

ABI = fa3_attention.loaded.abi
if ABI is None:
    pytest.skip(f"no usable FA3 build: {fa3_attention.loaded.why_none()}", allow_module_level=True)

D = 128
RAGGED = [0, 37, 37, 300]  # an empty segment between a short and a longer one
# appended so that packs clear every attention preference of the shipped profiles (the short-work rows
# that prefer torch varlen, the rows that prefer FA4's native sink on short packs): a longer key segment
LONG_TAIL = (
    max(
        c.value
        for f in shipped_profiles()
        for row in f.profile.preferences
        if row.op == "attention"
        for c in row.when
        if c.field == "max_seqlen_k" and isinstance(c.value, int)
    )
    + 64
)


def _inputs(cu_q: list[int], cu_k: list[int], hq: int, hkv: int, n_sinks: int, dtype: torch.dtype, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(cu_q[-1], hq, D, device="cuda", generator=g).to(dtype)
    k = torch.randn(cu_k[-1], hkv, D, device="cuda", generator=g).to(dtype)
    v = torch.randn(cu_k[-1], hkv, D, device="cuda", generator=g).to(dtype)
    # sinks near the rows' LSE (log of a few hundred keys) so the correction changes o materially
    sinks = (torch.randn(n_sinks, hq, device="cuda", generator=g) * 2 + 5).float() if n_sinks else None
    cq = torch.tensor(cu_q, dtype=torch.int32, device="cuda")
    ck = torch.tensor(cu_k, dtype=torch.int32, device="cuda")
    return q, k, v, cq, ck, sinks


def _reference(q, k, v, cq, ck, *, softcap, sinks, rescale):
    lens_q = (cq[1:] - cq[:-1]).tolist()
    lens_k = (ck[1:] - ck[:-1]).tolist()
    return reference_attention(
        call_record(
            "attention",
            q,
            k,
            v,
            cq,
            ck,
            max_seqlen_q=max(lens_q),
            max_seqlen_k=max(lens_k),
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
def test_public_attention_matches_reference(registered, dtype, hq, hkv, softcap, n_sinks):
    cu_q = [*RAGGED, RAGGED[-1] + LONG_TAIL]
    cu_k = [0, 41, 41, 330, 330 + LONG_TAIL]
    if dtype == torch.float16 and not ABI.fp16:
        q, k, v, cq, ck, sinks = _inputs(cu_q, cu_k, hq, hkv, n_sinks, dtype, 0)
        with pytest.raises(ProviderNotEligibleError) as err:
            m2.attention(q, k, v, cq, ck, softcap=softcap, sinks=sinks, provider="fa3")
        (fa3,) = [c for c in err.value.resolution.candidates if c.provider == "fa3"]
        # The descriptor of a build without FP16 leaves float16 out, so the static dtype check refuses
        # first; a descriptor that still claims it leaves the refusal to the run-time check.
        if "float16" in m2.get_registry().provider("attention", "fa3").capability.dtypes:
            assert "FLASHATTENTION_DISABLE_FP16" in err.value.resolution.explain()
        else:
            assert [r.code for r in fa3.reasons] == [ReasonCode.DTYPE] and fa3.reasons[0].actual == "float16"
        return
    for seed in (1, 2):
        q, k, v, cq, ck, sinks = _inputs(cu_q, cu_k, hq, hkv, n_sinks, dtype, seed)
        sinks_before = None if sinks is None else sinks.clone()
        o, lse = m2.attention(q, k, v, cq, ck, softcap=softcap, sinks=sinks, return_lse=True, provider="fa3")
        ro, rlse = _reference(q, k, v, cq, ck, softcap=max(softcap, 0.0), sinks=sinks, rescale="fp32")
        assert accept_attention(o, ro), accept_attention(o, ro)
        assert accept_lse(lse, rlse, dtype), accept_lse(lse, rlse, dtype)
        assert o.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (hq, cu_q[-1])
        if sinks is not None:  # never mutated, never rounded
            assert torch.equal(sinks, sinks_before) and sinks.dtype == torch.float32


@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize("rescale", ["fp32", "activation"])
def test_short_ragged_pack_on_the_kernel(n_sinks, rescale):
    dtype = torch.bfloat16
    for seed in (3, 4):
        q, k, v, cq, ck, sinks = _inputs(RAGGED, [0, 41, 41, 330], 6, 2, n_sinks, dtype, seed)
        o, lse = fa3_attention(
            call_record(
                "attention",
                q,
                k,
                v,
                cq,
                ck,
                max_seqlen_q=263,
                max_seqlen_k=289,
                softmax_scale=D**-0.5,
                softcap=0.0,
                sinks=sinks,
                sink_rescale=rescale,
                deterministic=False,
                return_lse=True,
            )
        )
        ro, rlse = _reference(q, k, v, cq, ck, softcap=0.0, sinks=sinks, rescale=rescale)
        assert accept_attention(o, ro), accept_attention(o, ro)
        assert accept_lse(lse, rlse, dtype), accept_lse(lse, rlse, dtype)
        assert lse.shape == (6, RAGGED[-1]) and bool(torch.isfinite(lse).all())


def test_empty_key_segment_gives_zero_output_and_sink_lse():
    dtype = torch.bfloat16
    q, k, v, cq, ck, sinks = _inputs([0, 5, 40], [0, 0, 50], 4, 4, 1, dtype, 5)
    o, lse = fa3_attention(
        call_record(
            "attention",
            q,
            k,
            v,
            cq,
            ck,
            max_seqlen_q=35,
            max_seqlen_k=50,
            softmax_scale=D**-0.5,
            softcap=0.0,
            sinks=sinks,
            sink_rescale="fp32",
            deterministic=False,
            return_lse=True,
        )
    )
    ro, rlse = _reference(q, k, v, cq, ck, softcap=0.0, sinks=sinks, rescale="fp32")
    assert torch.equal(o[:5], torch.zeros_like(o[:5]))
    assert accept_attention(o, ro) and accept_lse(lse, rlse, dtype)


def test_deterministic_repeat_is_bitwise_equal(registered):
    cu = [0, 700, 700 + LONG_TAIL]
    q, k, v, cq, ck, sinks = _inputs(cu, cu, 8, 4, 1, torch.bfloat16, 6)
    a = m2.attention(q, k, v, cq, ck, sinks=sinks, deterministic=True, return_lse=True, provider="fa3")
    b = m2.attention(q, k, v, cq, ck, sinks=sinks, deterministic=True, return_lse=True, provider="fa3")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_resolution_short_work_preferences(registered):
    long_cu = [0, LONG_TAIL]
    q, k, v, cq, ck, sinks = _inputs(long_cu, long_cu, 24, 24, 1, torch.bfloat16, 7)
    assert m2.resolve("attention", q, k, v, cq, ck).chosen == "fa3"
    assert m2.resolve("attention", q, k, v, cq, ck, sinks=sinks).chosen == "fa3"
    q, k, v, cq, ck, sinks = _inputs(RAGGED, RAGGED, 24, 24, 1, torch.bfloat16, 8)
    # no sinks, no cap, small work: torch's varlen kernel where this device's profile prefers it
    res = m2.resolve("attention", q, k, v, cq, ck)
    row = active_profile(q.device).preference_for(res.problem)
    if row is not None and row.prefer[0] == "torch_varlen":
        assert res.chosen == "torch_varlen" and res.decided_by == "profile", res.explain()
    else:
        assert res.chosen == "fa3", res.explain()
    # what torch_varlen cannot serve goes to FA3, never to the reference: a softcap, determinism, GQA
    # (where this torch's varlen_attn has no enable_gqa)
    assert m2.resolve("attention", q, k, v, cq, ck, softcap=2.0).chosen == "fa3"
    res = m2.resolve("attention", q, k, v, cq, ck, deterministic=True)
    assert res.chosen == "fa3", res.explain()
    q8, k8, v8, *_ = _inputs(RAGGED, RAGGED, 24, 8, 1, torch.bfloat16, 8)
    res = m2.resolve("attention", q8, k8, v8, cq, ck)
    assert res.chosen in ("fa3", "torch_varlen") and res.chosen != "reference", res.explain()
    # sinks: the profile's row where this device's profile has one (its first eligible provider: FA4's
    # native sink needs FA4 installed; the H100's tune put torch_varlen first at short work), else FA3
    res = m2.resolve("attention", q, k, v, cq, ck, sinks=sinks)
    row = active_profile(q.device).preference_for(res.problem)
    if row is None:
        assert res.chosen == "fa3", res.explain()
    else:
        assert res.decided_by == "profile" and res.chosen in row.prefer, res.explain()


def test_torch_compile_matches_eager(registered):
    cu = [0, 100, 100 + LONG_TAIL]
    q, k, v, cq, ck, sinks = _inputs(cu, cu, 8, 8, 1, torch.bfloat16, 9)
    kw = {"max_seqlen_q": LONG_TAIL, "max_seqlen_k": LONG_TAIL, "sinks": sinks, "provider": "fa3"}

    def f(q, k, v):
        return m2.attention(q, k, v, cq, ck, **kw)

    eager = f(q, k, v)
    compiled = torch.compile(f, fullgraph=True)(q, k, v)
    assert torch.equal(eager, compiled)


@pytest.mark.parametrize("n_sinks", [1, 2])
@pytest.mark.parametrize(
    ("rescale", "return_lse"),
    [("fp32", True), ("fp32", False), ("activation", True)],
    ids=["fp32-lse", "fp32", "activation-lse"],
)
@pytest.mark.parametrize("kind", SINK_KINDS)
def test_upstream_sink_kinds(registered, kind, rescale, return_lse, n_sinks):
    """Upstream's sink kinds through the public op: FA3 + the CUDA sink correction (the fused Triton one
    where magi2-backend-triton is installed), or the build's native sink where it takes them."""
    cu_q = [0, 37, 60, 300, 300 + LONG_TAIL]
    cu_k = [0, 41, 41, 330, 330 + LONG_TAIL]  # the second segment has queries but no keys
    q, k, v, cq, ck, _ = _inputs(cu_q, cu_k, 6, 2, 0, torch.bfloat16, 11)
    sinks = sink_logits(kind, n_sinks, 6, torch.Generator().manual_seed(n_sinks)).cuda()
    kw = {"sinks": sinks, "sink_rescale": rescale, "provider": "fa3"}
    out = m2.attention(q, k, v, cq, ck, return_lse=return_lse, **kw)
    o, lse = out if return_lse else (out, None)
    ro, rlse = _reference(q, k, v, cq, ck, softcap=0.0, sinks=sinks, rescale=rescale)
    assert accept_attention(o, ro), accept_attention(o, ro)
    if return_lse:
        assert accept_lse(lse, rlse, torch.bfloat16), accept_lse(lse, rlse, torch.bfloat16)
    plain_o, plain_lse = fa3_attention(
        call_record(
            "attention",
            q,
            k,
            v,
            cq,
            ck,
            max_seqlen_q=max(240, LONG_TAIL),
            max_seqlen_k=max(289, LONG_TAIL),
            softmax_scale=D**-0.5,
            softcap=0.0,
            sinks=None,
            sink_rescale=rescale,
            deterministic=False,
            return_lse=True,
        )
    )
    # a native sink (tokenspeed-fa3: one row, FP32, no LSE) is another kernel: equal within the contract
    native = ABI.sinks and n_sinks == 1 and rescale == "fp32" and not return_lse
    assert (
        oracles.sink_kind_violations(o, lse, sinks, plain_o, plain_lse if return_lse else None, exact=not native) == []
    )
