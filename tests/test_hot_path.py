"""A repeated call layout reuses its validation, but never lets through what validation would refuse."""

from __future__ import annotations

import pytest
import torch

import magi2_core as m2
from magi2_core.errors import InvalidInputError

P = "reference"


def _attn() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(9, 2, 16, generator=g) for _ in range(3))
    return q, k, v, torch.tensor([0, 4, 9], dtype=torch.int32)


def test_sinks_made_non_finite_in_place_are_caught() -> None:
    q, k, v, cu = _attn()
    sinks = torch.randn(1, 2)
    m2.attention(q, k, v, cu, cu, sinks=sinks, provider=P)
    m2.attention(q, k, v, cu, cu, sinks=sinks, provider=P)  # cached layout, sinks already found finite
    sinks[0, 1] = float("nan")
    with pytest.raises(InvalidInputError, match="sinks"):
        m2.attention(q, k, v, cu, cu, sinks=sinks, provider=P)


def test_host_prefix_sums_are_checked_by_value_every_call() -> None:
    q, k, v, cu = _attn()
    m2.attention(q, k, v, cu, cu, provider=P)
    with pytest.raises(InvalidInputError, match="cu_seqlens_k"):
        m2.attention(q, k, v, cu, torch.tensor([0, 6, 5], dtype=torch.int32), provider=P)
    out = m2.attention(q, k, v, cu, torch.tensor([0, 2, 9], dtype=torch.int32), provider=P)
    ref = m2.attention(q, k, v, cu, torch.tensor([0, 2, 9], dtype=torch.int32), provider=P)
    assert torch.equal(out, ref)


def test_a_bad_scalar_equal_to_a_cached_one_is_still_refused() -> None:
    q, k, v, cu = _attn()
    m2.attention(q, k, v, cu, cu, max_seqlen_q=5, max_seqlen_k=5, provider=P)
    with pytest.raises(InvalidInputError, match="max_seqlen_q"):
        m2.attention(q, k, v, cu, cu, max_seqlen_q=5.0, max_seqlen_k=5, provider=P)  # type: ignore[arg-type]
    x, w = torch.randn(5, 2, 8), torch.randn(8, 8)
    m2.moe_route(x, w, None, top_k=1, provider=P)
    with pytest.raises(InvalidInputError, match="top_k"):
        m2.moe_route(x, w, None, top_k=True, provider=P)  # True == 1 hashes like 1


def test_router_bias_and_expert_ids_are_checked_after_caching() -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 2, 8, generator=g)
    w, bias = torch.randn(8, 8, generator=g), torch.randn(8, generator=g)
    m2.moe_route(x, w, bias, top_k=2, provider=P)
    bias[3] = float("nan")
    with pytest.raises(InvalidInputError, match="bias"):
        m2.moe_route(x, w, bias, top_k=2, provider=P)
    probs, idx = torch.rand(2, 5, 2, generator=g), torch.randint(0, 4, (2, 5, 2), generator=g)
    wg, wu = torch.randn(8, 8, 16, generator=g), torch.randn(8, 8, 16, generator=g)
    wd = torch.randn(8, 16, 8, generator=g)
    m2.moe_experts(x, probs, idx, wg, wu, wd, provider=P)
    with pytest.raises(InvalidInputError, match="idx"):
        m2.moe_experts(x, probs, idx + 3, wg, wu, wd, provider=P)


def test_modality_sizes_of_another_type_meet_validation() -> None:
    x, w = torch.randn(6, 32), torch.randn(2, 1, 32)
    m2.rmsnorm(x, w, modality_sizes=[2, 4], provider=P)
    with pytest.raises(InvalidInputError, match="modality_sizes"):
        m2.rmsnorm(x, w, modality_sizes=[True, 5], provider=P)  # True == 1 hashes like 1
    with pytest.raises(InvalidInputError, match="modality_sizes"):
        m2.rmsnorm(x, w, modality_sizes=torch.tensor([2, 4]), provider=P)


def test_non_contiguous_prefix_sums_are_normalised_on_a_cached_layout() -> None:
    q, k, v, cu = _attn()
    m2.attention(q, k, v, cu, cu, provider=P)
    strided = torch.tensor([0, 0, 4, 0, 9, 0], dtype=torch.int32)[::2]
    assert not strided.is_contiguous()
    assert torch.equal(m2.attention(q, k, v, strided, strided, provider=P), m2.attention(q, k, v, cu, cu, provider=P))


def test_one_prefix_sum_tensor_for_both_sides_is_still_checked_by_value() -> None:
    # Self-attention passes one tensor as cu_seqlens_q and cu_seqlens_k: its values are keyed once.
    q, k, v, cu = _attn()
    m2.attention(q, k, v, cu, cu, provider=P)
    bad = torch.tensor([0, 6, 5], dtype=torch.int32)
    with pytest.raises(InvalidInputError, match="cu_seqlens_q"):
        m2.attention(q, k, v, bad, bad, provider=P)
    other = torch.tensor([0, 2, 9], dtype=torch.int32)
    assert torch.equal(
        m2.attention(q, k, v, other, other, provider=P), m2.attention(q, k, v, other, other.clone(), provider=P)
    )
    with pytest.raises(InvalidInputError, match="cu_seqlens_k"):  # after (cu, cu): a separate k is keyed apart
        m2.attention(q, k, v, cu, bad, provider=P)


@pytest.mark.gpu
def test_device_prefix_sums_shared_by_both_sides_are_keyed_by_value_where_a_length_is_derived() -> None:
    # max_seqlen_q given, max_seqlen_k not: cu_seqlens_q alone would be keyed by shape, but the k side
    # derives its longest segment from the values, so the shared tensor's values stay in the key.
    q, k, v, cu = (t.cuda() for t in _attn())
    m2.attention(q, k, v, cu, cu, max_seqlen_q=9, provider=P)
    bad = torch.tensor([0, 6, 5], dtype=torch.int32, device="cuda")
    with pytest.raises(InvalidInputError, match=r"cu_seqlens_[qk]"):  # refused, not taken from the cache
        m2.attention(q, k, v, bad, bad, max_seqlen_q=9, provider=P)
    other = torch.tensor([0, 2, 9], dtype=torch.int32, device="cuda")
    ref = m2.attention(q.cpu(), k.cpu(), v.cpu(), other.cpu(), other.cpu(), provider=P)
    torch.testing.assert_close(m2.attention(q, k, v, other, other, max_seqlen_q=9, provider=P).cpu(), ref)


def test_host_expert_ids_are_range_checked_on_every_cached_call() -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 2, 8, generator=g)
    probs, idx = torch.rand(2, 5, 2, generator=g), torch.randint(0, 4, (2, 5, 2), generator=g)
    wg, wu = torch.randn(8, 8, 16, generator=g), torch.randn(8, 8, 16, generator=g)
    wd = torch.randn(8, 16, 8, generator=g)
    m2.moe_experts(x, probs, idx, wg, wu, wd, provider=P)
    for where, value, shown in (((0, 0, 0), -1, r"values in \[-1, "), ((1, 4, 1), 4, r", 4\]")):
        bad = idx.clone()
        bad[where] = value
        with pytest.raises(InvalidInputError, match=shown):
            m2.moe_experts(x, probs, bad, wg, wu, wd, provider=P)


def test_weights_asking_for_grad_are_refused_on_a_cached_layout() -> None:
    g = torch.Generator().manual_seed(6)
    x = torch.randn(5, 2, 8, generator=g)
    probs, idx = torch.rand(2, 5, 2, generator=g), torch.randint(0, 4, (2, 5, 2), generator=g)
    w = [torch.randn(8, 8, 16, generator=g), torch.randn(8, 8, 16, generator=g), torch.randn(8, 16, 8, generator=g)]
    m2.moe_experts(x, probs, idx, *w, provider=P)
    for i, name in enumerate(("w_gate", "w_up", "w_down")):
        asking = list(w)
        asking[i] = w[i].clone().requires_grad_()
        with pytest.raises(InvalidInputError, match=name):
            m2.moe_experts(x, probs, idx, *asking, provider=P)


def test_attention_inputs_asking_for_grad_are_refused_on_a_cached_layout() -> None:
    q, k, v, cu = _attn()
    sinks = torch.randn(1, 2)
    m2.attention(q, k, v, cu, cu, sinks=sinks, provider=P)
    for name in ("q", "k", "v", "sinks"):
        args = {"q": q, "k": k, "v": v, "sinks": sinks}
        args[name] = args[name].clone().requires_grad_()
        with pytest.raises(InvalidInputError, match=rf"'{name}'.*forward-only"):
            m2.attention(args["q"], args["k"], args["v"], cu, cu, sinks=args["sinks"], provider=P)
        with torch.no_grad():  # the same call runs where no gradient is recorded
            m2.attention(args["q"], args["k"], args["v"], cu, cu, sinks=args["sinks"], provider=P)
