"""The ``triton`` provider of ``moe_route``: biased top-k selection, weights, normalisation in one kernel.

Exactness first. The scores come from :func:`magi2_core.contracts.moe.router_scores`, the same torch
GEMM + sigmoid/softmax that the reference runs, so they are the reference's scores bit for bit (a
GEMM written here would sum in another order, and near-ties would then pick other experts). One
kernel does everything after that: ``score + bias`` (one IEEE FP32 add, as the reference), the
top-k in descending order with equal values in ascending expert id, the gather of the unbiased
scores, the optional L1 normalisation and ``route_scale``. The selection is therefore identical to
the reference's, ties included; only the FP32 L1 sum may differ in its last bit (the contract's
1e-5 tolerance on the weights).

Selection. Each (head, token) row of E scores is held in registers as int64 keys: the high 32 bits
are the FP32 value mapped to an integer of the same order (``-0.0`` first folded into ``+0.0`` and
every NaN into one positive NaN, which ranks above ``+inf`` as in torch's sort), the low 32 bits are
``BLOCK_E - expert`` so that among equal values the lower expert id has the larger key. Each of the
``top_k`` steps is then one integer max-reduction per row, and the winner's key is knocked out.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from magi2_backend_triton.providers import described_reasons, device_reasons
from magi2_core.backend import CheckedOn, Problem, Reason, RouteCall, VirtualDevice, router_scores

__all__ = ["TritonMoERoute", "select_routes", "triton_moe_route"]

# Below every real key: a real key's high half is at least the order-mapped -inf (> -2**31).
_REMOVED = tl.constexpr(-(2**63))
# One (head, token) row per one-warp program: every row reduction stays inside a warp (shuffles, no
# shared-memory round trips). Measured on the H200 at 3 heads x 256 experts (route_profile_h200.json):
# 0.052 ms at T = 14601 against 0.072 ms for 8 rows x 4 warps and 0.112 ms for 32 rows x 8 warps.
_BLOCK_T = 1
_NUM_WARPS = 1
# The CPU interpreter pays per program, not per warp: 16 rows per program there (5x faster tests).
_INTERPRETER_BLOCK_T = 16


@triton.jit(do_not_specialize=["n_tok"])
def _select_kernel(
    scores_ptr,
    bias_ptr,
    probs_ptr,
    idx_ptr,
    n_tok,
    route_scale,
    E: tl.constexpr,
    K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    NORM: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    head = tl.program_id(1).to(tl.int64)
    toks = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    tok_ok = toks < n_tok
    rows = head * n_tok + toks  # row of the [Hl·T, E] scores and of the [Hl·T, K] outputs
    cols = tl.arange(0, BLOCK_E)
    col_ok = cols < E
    s = tl.load(scores_ptr + rows[:, None] * E + cols[None, :], mask=tok_ok[:, None] & col_ok[None, :], other=0.0)
    sel = s
    if HAS_BIAS:
        sel = s + tl.load(bias_ptr + head * E + cols, mask=col_ok, other=0.0)[None, :]
    sel = tl.where(sel == 0.0, 0.0, sel)  # -0.0 equals +0.0 for the comparison, so one key for both
    sel = tl.where(sel != sel, float("nan"), sel)  # every NaN -> the one positive NaN (ranks highest)
    bits = sel.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: flip the magnitude, so int order = float order
    key = (ordered.to(tl.int64) << 32) | (BLOCK_E - cols).to(tl.int64)[None, :]
    key = tl.where(col_ok[None, :], key, _REMOVED)

    kcols = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)
    for k in range(K):
        best = tl.max(key, axis=1)
        expert = BLOCK_E - (best & 0xFFFFFFFF).to(tl.int32)
        key = tl.where(cols[None, :] == expert[:, None], _REMOVED, key)
        ids = tl.where(kcols[None, :] == k, expert[:, None], ids)
    mask = tok_ok[:, None] & (kcols < K)[None, :]
    # The unbiased scores of the winners, gathered from memory (the row was just read: a cache hit)
    # rather than by one more row reduction per step.
    probs = tl.load(scores_ptr + rows[:, None] * E + ids, mask=mask, other=0.0)
    if NORM:
        probs = probs / tl.maximum(tl.sum(tl.abs(probs), axis=1), 1e-12)[:, None]
    probs = probs * route_scale
    out = rows[:, None] * K + kcols[None, :]
    tl.store(probs_ptr + out, probs, mask=mask)
    tl.store(idx_ptr + out, ids.to(tl.int64), mask=mask)


def select_routes(
    scores: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    top_k: int,
    route_scale: float,
    route_norm: bool,
    block_t: int | None = None,
    num_warps: int = _NUM_WARPS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(probs [Hl, T, K] FP32, idx [Hl, T, K] int64)`` from FP32 scores ``[Hl, T, E]`` (launch only).

    ``block_t`` / ``num_warps``: (token rows per program, warps); the defaults are the measured ones.
    """
    hl, t, e = scores.shape
    probs = torch.empty((hl, t, top_k), dtype=torch.float32, device=scores.device)
    idx = torch.empty((hl, t, top_k), dtype=torch.int64, device=scores.device)
    if t == 0 or hl == 0:
        return probs, idx
    block_e = triton.next_power_of_2(e)
    if block_t is None:
        block_t = _INTERPRETER_BLOCK_T if scores.device.type == "cpu" else _BLOCK_T
    scores = scores.contiguous()
    _select_kernel[(triton.cdiv(t, block_t), hl)](
        scores,
        scores if bias is None else bias,  # never read without HAS_BIAS
        probs,
        idx,
        t,
        float(route_scale),
        E=e,
        K=top_k,
        HAS_BIAS=bias is not None,
        NORM=route_norm,
        BLOCK_T=block_t,
        BLOCK_E=block_e,
        BLOCK_K=triton.next_power_of_2(top_k),
        num_warps=num_warps,
    )
    return probs, idx


class TritonMoERoute:
    """Shared torch scores (bit-identical to the reference's) + one fused selection kernel."""

    version = triton.__version__

    def check(self, problem: Problem) -> Sequence[Reason]:
        return device_reasons(problem.device_type)

    def check_on(self, problem: Problem, device: VirtualDevice) -> CheckedOn:
        return described_reasons(device)

    def __call__(self, call: RouteCall) -> tuple[torch.Tensor, torch.Tensor]:
        scores = router_scores(call.x, call.router_weight, call.score_func)
        return select_routes(
            scores, call.bias, top_k=call.top_k, route_scale=call.route_scale, route_norm=call.route_norm
        )


triton_moe_route = TritonMoERoute()
