"""Each op's declared arguments (``magi2_core.ops._args``) and what is derived from them agree with the
public function: its written signature, its custom op's schema, its docstring, ``validate_arguments``."""

from __future__ import annotations

import pytest
import torch

import magi2_core as m2
from magi2_core.contracts.moe_weights import CHECKPOINT, PreparedMoEWeights
from magi2_core.ops import SPECS, dispatcher
from magi2_core.ops._args import TENSOR, Arg, Args
from magi2_core.selection.overrides import context_token

DECLARED = {op: spec for op, spec in SPECS.items() if spec.args is not None}
PUBLIC = {op: getattr(m2, op) for op in SPECS}

# the torch.library schemas, as written by hand before the declarations (torch.compile graphs record them)
SCHEMAS = {
    "attention": "magi2::attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
    "SymInt? max_seqlen_q, SymInt? max_seqlen_k, float? softmax_scale, float softcap, Tensor? sinks, "
    "bool deterministic, str sink_rescale, str? provider) -> (Tensor, Tensor)",
    "rmsnorm": "magi2::rmsnorm(Tensor x, Tensor weight, float eps, SymInt[]? modality_sizes, "
    "ScalarType? out_dtype, str? provider) -> Tensor",
    "moe_route": "magi2::moe_route(Tensor x, Tensor router_weight, Tensor? bias, SymInt top_k, float route_scale, "
    "bool route_norm, str score_func, str? provider) -> (Tensor, Tensor)",
    "moe_experts": "magi2::moe_experts(Tensor x, Tensor probs, Tensor idx, Tensor[] weights, str layout, "
    "bool deterministic, str? provider) -> Tensor",
    "mhc_pre": "magi2::mhc_pre(Tensor streams, Tensor norm_weight, Tensor phi, Tensor alpha_pre, Tensor alpha_post, "
    "Tensor alpha_res, Tensor bias_pre, Tensor bias_post, Tensor bias_res, float eps, SymInt[]? modality_sizes, "
    "SymInt sinkhorn_iterations, float sinkhorn_eps, ScalarType? out_dtype, str? provider) -> (Tensor, Tensor, Tensor)",
    "mhc_mix": "magi2::mhc_mix(Tensor streams, Tensor branch_output, Tensor post, Tensor residual, str? provider) "
    "-> Tensor",
    "qk_norm_rope": "magi2::qk_norm_rope(Tensor x, Tensor weight, Tensor rope, float eps, SymInt[]? modality_sizes, "
    "Tensor? index, ScalarType? out_dtype, str? provider) -> Tensor",
    "output_gate": "magi2::output_gate(Tensor x, Tensor gate, Tensor? index, ScalarType? out_dtype, str? provider) "
    "-> Tensor",
}


def test_every_op_is_declared() -> None:
    assert set(DECLARED) == set(SPECS)
    assert all(isinstance(spec.args, Args) and spec.args.op == op for op, spec in SPECS.items())


def test_packed_weights_reach_validation_as_checkpoint_views() -> None:
    x, probs, idx = torch.randn(3, 2, 4), torch.rand(2, 3, 1), torch.zeros(2, 3, 1, dtype=torch.int64)
    wg, wu, wd = torch.randn(4, 4, 6), torch.randn(4, 4, 6), torch.randn(4, 6, 4)
    spec = SPECS["moe_experts"]
    by_keyword = spec.validate_arguments((x, probs, idx, wg), {"w_up": wu, "w_down": wd})
    prepared = PreparedMoEWeights.from_layout("reference", CHECKPOINT, (wg, wu, wd))
    packed = spec.validate_arguments((x, probs, idx, prepared), {})
    assert packed.w_gate is wg and packed.w_down is wd and packed.key == by_keyword.key
    assert spec.args.pack is not None
    given = spec.args.pack.pack(prepared, None, None)
    assert given == ([wg, wu, wd], CHECKPOINT)
    values, provider = spec.args.from_schema([x, probs, idx, *given, True, "reference"])
    assert values[3:6] == [wg, wu, wd] and values[6] is True and provider == "reference"
    with pytest.raises(m2.InvalidValueError, match="w_up/w_down"):
        spec.validate_arguments((x, probs, idx, prepared, wu), {})


@pytest.mark.parametrize("op", sorted(PUBLIC))
def test_the_written_signature_is_the_declared_one(op: str) -> None:
    args = DECLARED[op].args
    assert args is not None
    assert args.signature_errors(PUBLIC[op]) == []
    assert DECLARED[op].arg_names == args.positional


@pytest.mark.parametrize("op", sorted(PUBLIC))
def test_the_custom_op_schema_is_derived_unchanged(op: str) -> None:
    assert str(getattr(torch.ops.magi2, op).default._schema) == SCHEMAS[op]


@pytest.mark.parametrize("op", sorted(PUBLIC))
def test_every_argument_is_documented(op: str) -> None:
    doc = PUBLIC[op].__doc__ or ""
    args = DECLARED[op].args
    assert args is not None
    section = doc[doc.index("Args:") : doc.index("Returns:")]
    for name in (*args.names, "provider"):
        assert f" {name}:" in section or f" {name}," in section, name


def test_a_signature_that_disagrees_is_named() -> None:
    args = Args("rmsnorm", (Arg("x", "torch.Tensor", "x.", layout=TENSOR), Arg("eps", "float", "eps.", 1e-6)))

    def renamed(x: torch.Tensor, *, epsilon: float = 1e-6, provider: str | None = None) -> None: ...

    def other_default(x: torch.Tensor, *, eps: float = 1e-5, provider: str | None = None) -> None: ...

    def other_type(x: torch.Tensor, *, eps: int = 1, provider: str | None = None) -> None: ...

    def positional(x: torch.Tensor, eps: float = 1e-6, provider: str | None = None) -> None: ...

    def no_provider(x: torch.Tensor, *, eps: float = 1e-6) -> None: ...

    assert "parameters ['x', 'epsilon']" in args.signature_errors(renamed)[0]
    assert args.signature_errors(other_default) == ["eps: default 1e-05, declared 1e-06"]
    assert "eps: annotation 'int'" in " ".join(args.signature_errors(other_type))
    assert args.signature_errors(positional) == ["eps: positional or keyword, declared keyword-only"]
    assert "provider" in args.signature_errors(no_provider)[0]
    with pytest.raises(TypeError, match="disagrees with its declared arguments"):
        args.public(renamed)


def test_the_cache_lookup_is_generated_from_the_declaration() -> None:
    x, w = torch.randn(4, 8), torch.randn(1, 1, 8)
    dispatcher().clear()
    m2.rmsnorm(x, w, eps=1e-5)
    (key,) = dispatcher().bound_calls()
    assert key == (
        "rmsnorm",
        None,
        context_token(),
        x.shape,
        x.dtype,
        x.device,
        w.shape,
        w.dtype,
        w.device,
        1e-5,
        float,
        None,
        None,
    )
    m2.rmsnorm(x, w, eps=torch.tensor(1e-5))  # a number given as a tensor: validated, never kept
    assert list(dispatcher().bound_calls()) == [key]
    args = Args("rmsnorm", (Arg("x", "torch.Tensor", "x.", layout=TENSOR), Arg("eps", "float", "eps.", 1e-6)))
    assert args.cacheable((x, 1e-6)) and not args.cacheable((x, torch.tensor(1e-6)))


def test_validate_arguments_fills_the_declared_defaults() -> None:
    x, w = torch.randn(4, 8), torch.randn(1, 1, 8)
    call = SPECS["rmsnorm"].validate_arguments((x, w), {})
    assert call.eps == 1e-6 and call.modality_sizes is None and call.out_dtype is torch.float32
    q = torch.randn(4, 2, 8)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    a = SPECS["attention"].validate_arguments((q, q, q, cu, cu), {"softcap": 2.0})
    assert a.softcap == 2.0 and a.sink_rescale == "fp32" and not a.return_lse
    with pytest.raises(TypeError):
        SPECS["rmsnorm"].validate_arguments((x, w), {"epsilon": 1.0})
