"""``m2.mhc_pre`` and ``m2.mhc_mix`` on CPU (operators.md §5): the reference against an independent
per-token float64 oracle, vllm-omni's native form against the acceptance rules, non-finite
semantics, multi-modality sizes with empty groups, validation, and torch.compile."""

from __future__ import annotations

import math

import pytest
import torch
from magi2_backend_reference.torch_mhc import torch_mhc_mix, torch_mhc_pre

import magi2_core as m2
from magi2_core.contracts import acceptance as acc
from magi2_core.errors import InvalidDTypeError, InvalidShapeError, InvalidValueError
from magi2_core.testing import call_record
from magi2_core.testing.op_cases.mhc_pre import mhc_parameters, mhc_streams

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _oracle_pre(
    x: torch.Tensor,
    params: tuple[torch.Tensor, ...],
    sizes: list[int] | None,
    od: torch.dtype,
    iterations: int = 20,
    eps: float = 1e-6,
    s_eps: float = 1e-12,
) -> tuple[torch.Tensor, ...]:
    """Token by token, in float64, written from the formulas of operators.md §5.2."""
    w, phi, a_pre, a_post, a_res, b_pre, b_post, b_res = (p.double() for p in params)
    t, n, d = x.shape
    w = w.reshape(-1, n * d)
    group = [m for m, size in enumerate(sizes or [t]) for _ in range(size)]
    s = 1 / math.sqrt(n * d)
    hs, posts, ress = [], [], []
    for i in range(t):
        row = x[i].double().reshape(-1)
        logits = (row / torch.sqrt((row * row).mean() + eps) * (w[group[i]] + 1)) @ phi
        c = torch.sigmoid(a_pre * s * logits[:n] + b_pre).to(x.dtype).double()
        hs.append(sum(c[j] * x[i, j].double() for j in range(n)).to(x.dtype))
        posts.append((2 * torch.sigmoid(a_post * s * logits[n : 2 * n] + b_post)).to(od))
        z = a_res * s * logits[2 * n :].reshape(n, n) + b_res
        p = torch.exp(z - z.max()) if not torch.isnan(z).any() else torch.full_like(z, float("nan"))
        for _ in range(iterations):
            p = p / (p.sum(dim=0, keepdim=True) + s_eps)
            p = p / (p.sum(dim=1, keepdim=True) + s_eps)
        ress.append(p.to(od))
    if t == 0:
        return x.new_empty((0, d)), torch.empty((0, n), dtype=od), torch.empty((0, n, n), dtype=od)
    return torch.stack(hs), torch.stack(posts), torch.stack(ress)


def _pre_inputs(
    seed: int, t: int, n: int, d: int, dtype: torch.dtype, sizes: list[int] | None
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    return mhc_streams(g, t, n, d, dtype), mhc_parameters(g, 1 if sizes is None else len(sizes), n, d)


def _accepts(got: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...], x: torch.Tensor) -> list[acc.Acceptance]:
    return [
        acc.accept_mhc_branch_input(got[0], ref[0], x),
        acc.accept_mhc_coefficients(got[1], ref[1], "post"),
        acc.accept_mhc_coefficients(got[2], ref[2], "residual"),
    ]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("t", "n", "d", "sizes"), [(13, 4, 32, None), (12, 4, 24, [5, 0, 7]), (6, 3, 16, [0, 6]), (0, 4, 16, [0])]
)
def test_reference_matches_the_token_by_token_oracle(
    dtype: torch.dtype, t: int, n: int, d: int, sizes: list[int] | None
) -> None:
    x, params = _pre_inputs(t * 7 + n, t, n, d, dtype, sizes)
    for od in (None, torch.float32):
        got = m2.mhc_pre(x, *params, modality_sizes=sizes, out_dtype=od, provider="reference")
        want = _oracle_pre(x, params, sizes, od or dtype)
        for verdict in _accepts(got, want, x):
            assert verdict, str(verdict)
        assert got[0].dtype == dtype and got[1].dtype == got[2].dtype == (od or dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vllm_omnis_native_form_passes_the_contract(dtype: torch.dtype, seed: int) -> None:
    """The rules admit upstream's own FP32 path (what the torch_native provider computes)."""
    sizes = [9, 0, 14]
    x, params = _pre_inputs(seed, 23, 4, 64, dtype, sizes)
    call = call_record("mhc_pre", x, *params, modality_sizes=sizes)
    ref = m2.mhc_pre(x, *params, modality_sizes=sizes, provider="reference")
    for verdict in _accepts(torch_mhc_pre(call), ref, x):
        assert verdict, str(verdict)
    g = torch.Generator().manual_seed(seed)
    y = mhc_streams(g, 23, 1, 64, dtype)[:, 0]
    mix = call_record("mhc_mix", x, y, ref[1], ref[2])
    verdict = acc.accept_mhc_mix(torch_mhc_mix(mix), m2.mhc_mix(x, y, ref[1], ref[2], provider="reference"), mix)
    assert verdict, str(verdict)


def test_the_rules_reject_wrong_results() -> None:
    sizes = [5, 6]
    x, params = _pre_inputs(3, 11, 4, 32, torch.bfloat16, sizes)
    ref = m2.mhc_pre(x, *params, modality_sizes=sizes)
    # the other modality's norm weight, no Sinkhorn iterations, sigmoid without the factor 2
    swapped = m2.mhc_pre(x, *params, modality_sizes=sizes[::-1])
    assert not acc.accept_mhc_branch_input(swapped[0], ref[0], x)
    assert not acc.accept_mhc_coefficients(swapped[1], ref[1], "post")
    unbalanced = m2.mhc_pre(x, *params, modality_sizes=sizes, sinkhorn_iterations=0)
    assert not acc.accept_mhc_coefficients(unbalanced[2], ref[2], "residual")
    assert not acc.accept_mhc_coefficients((ref[1].float() / 2).bfloat16(), ref[1], "post")
    y = x[:, 0].clone()
    mix = m2.mhc_mix(x, y, ref[1], ref[2])
    transposed = m2.mhc_mix(x, y, ref[1], ref[2].transpose(1, 2))
    assert not acc.accept_mhc_mix(transposed, mix, call_record("mhc_mix", x, y, ref[1], ref[2]))


def test_the_mix_rounds_each_term_before_the_sum() -> None:
    """cast(cast(R·x) + cast(p·y)) differs from one rounding of the exact sum; the reference keeps upstream's."""
    x = torch.tensor([[[1.0], [0.0]]], dtype=torch.bfloat16)  # T = 1, n = 2, D = 1
    residual = torch.tensor([[[1.0 + 2**-8, 0.0], [0.0, 1.0]]], dtype=torch.float32)  # R·x rounds to 1 + 2⁻⁷ or 1
    post = torch.tensor([[2**-8, 0.0]], dtype=torch.float32)
    y = torch.tensor([[1.0]], dtype=torch.bfloat16)
    out = m2.mhc_mix(x, y, post, residual, provider="reference")
    # exact: 1 + 2⁻⁸ + 2⁻⁸ = 1 + 2⁻⁷ (representable); term by term: cast(1 + 2⁻⁸) = 1 (tie to even), + 2⁻⁸ -> 1
    assert out[0, 0, 0].item() == 1.0


def test_nonfinite_streams_give_nan_tokens() -> None:
    x, params = _pre_inputs(5, 6, 4, 16, torch.bfloat16, None)
    x[1, 2, 3] = float("inf")
    x[4, 0, 0] = float("nan")
    h, post, res = m2.mhc_pre(x, *params)
    for t in (1, 4):
        assert h[t].isnan().all() and post[t].isnan().all() and res[t].isnan().all()
    others = [0, 2, 3, 5]
    assert h[others].isfinite().all() and res[others].isfinite().all()
    # a NaN residual-bias entry spreads over every token's whole matrix (upstream's amax), nothing else
    b_res = params[-1].clone()
    b_res[0, 1] = float("nan")
    _, post2, res2 = m2.mhc_pre(x, *params[:-1], b_res)
    assert res2.isnan().all() and torch.equal(post2[others], post[others])


@pytest.mark.parametrize(
    ("args", "error", "arg"),
    [
        ("sizes-tensor", InvalidShapeError, "modality_sizes"),
        ("phi-bf16", InvalidDTypeError, "phi"),
        ("bias-res-shape", InvalidShapeError, "bias_res"),
        ("alpha-two", InvalidShapeError, "alpha_post"),
        ("iterations-negative", InvalidValueError, "sinkhorn_iterations"),
        ("weight-modalities", InvalidShapeError, "norm_weight"),
    ],
)
def test_mhc_pre_rejects_invalid_inputs(args: str, error: type[Exception], arg: str) -> None:
    x, params = _pre_inputs(0, 8, 4, 16, torch.bfloat16, [3, 5])
    p = list(params)
    kw: dict[str, object] = {"modality_sizes": [3, 5]}
    if args == "sizes-tensor":
        kw["modality_sizes"] = torch.tensor([3, 5])
    elif args == "phi-bf16":
        p[1] = p[1].bfloat16()
    elif args == "bias-res-shape":
        p[7] = p[7][:3]
    elif args == "alpha-two":
        p[3] = torch.ones(2)
    elif args == "iterations-negative":
        kw["sinkhorn_iterations"] = -1
    else:
        kw["modality_sizes"] = [8]
    with pytest.raises(error) as info:
        m2.mhc_pre(x, *p, **kw)  # type: ignore[arg-type]
    assert info.value.arg == arg  # type: ignore[attr-defined]


@pytest.mark.parametrize("position", range(9))
def test_mhc_pre_names_a_tensor_that_requires_grad_and_an_argument_that_is_no_tensor(position: int) -> None:
    x, params = _pre_inputs(0, 8, 4, 16, torch.float32, None)
    args: list[object] = [x, *params]
    names = ("streams", "norm_weight", "phi", "alpha_pre", "alpha_post", "alpha_res")
    names += ("bias_pre", "bias_post", "bias_res")
    args[position] = args[position].clone().requires_grad_(True)  # type: ignore[attr-defined]
    with pytest.raises(InvalidValueError, match="requires_grad") as info:
        m2.mhc_pre(*args)  # type: ignore[arg-type]
    assert info.value.arg == names[position]
    with torch.no_grad():
        m2.mhc_pre(*args)  # type: ignore[arg-type]  # no gradient asked for: served
    args[position] = [1.0]
    with pytest.raises(InvalidDTypeError, match=r"torch\.Tensor") as wrong:
        m2.mhc_pre(*args)  # type: ignore[arg-type]
    assert wrong.value.arg == names[position]


def test_mhc_mix_rejects_a_branch_output_of_another_dtype() -> None:
    x = torch.randn(4, 4, 8).bfloat16()
    with pytest.raises(InvalidDTypeError, match="branch_output"):
        m2.mhc_mix(x, torch.randn(4, 8), torch.rand(4, 4), torch.rand(4, 4, 4))


def test_compiled_calls_match_eager_with_one_opaque_node_each() -> None:
    torch._dynamo.reset()
    sizes = [3, 0, 4]
    x, params = _pre_inputs(9, 7, 4, 16, torch.float32, sizes)
    y = torch.randn(7, 16)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h, post, res = m2.mhc_pre(x, *params, modality_sizes=sizes)
        return m2.mhc_mix(x, y + h, post, res)

    seen: list[str] = []

    def capture(gm: torch.fx.GraphModule, _inputs: object) -> object:
        seen.extend(str(n.target).removesuffix(".default") for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    assert torch.equal(torch.compile(step, fullgraph=True, backend=capture)(x, y), step(x, y))
    assert [s for s in seen if s.startswith("magi2.")] == ["magi2.mhc_pre", "magi2.mhc_mix"]
