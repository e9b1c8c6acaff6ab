"""``OpSpec``: one constructor call per op; what it checks at definition and how it names an op's outputs."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from magi2_core.ops import SPECS
from magi2_core.ops._spec import OpSpec
from magi2_core.ops.rmsnorm import ARGS as RMSNORM_ARGS
from magi2_core.ops.rmsnorm import SPEC as RMSNORM
from magi2_core.ops.rmsnorm import validate as validate_rmsnorm


class _WrongKey(NamedTuple):  # the head fields, then not rmsnorm's integer fields
    device: str
    dtype: str
    out_dtype: str
    features: int
    tokens: int


def test_a_key_type_whose_fields_are_not_the_ops_is_refused_where_the_spec_is_made() -> None:
    with pytest.raises(TypeError, match=r"_WrongKey fields .* are not HEAD \+ .*OP_INT_FIELDS\['rmsnorm'\]"):
        OpSpec(RMSNORM_ARGS, _WrongKey, validate_rmsnorm, outputs=("y",), accept=lambda *a: [])


@pytest.mark.parametrize("op", list(SPECS))
def test_each_spec_names_as_many_outputs_as_its_custom_op_returns(op: str) -> None:
    returns = getattr(torch.ops.magi2, op).default._schema.returns
    assert len(SPECS[op].output_names) == len(returns)  # type: ignore[index]
    assert SPECS[op].name == op and SPECS[op].args.op == op  # type: ignore[index]


def test_outputs_names_a_tensor_or_a_tuples_entries_leaving_out_none() -> None:
    a, b = torch.zeros(1), torch.ones(1)
    assert RMSNORM.outputs(a) == {"y": a}
    attention = SPECS["attention"]
    assert attention.outputs((a, b)) == {"o": a, "lse": b}
    assert attention.outputs((a, None)) == {"o": a}  # an LSE not asked for
    assert attention.outputs(a) == {"o": a}
    with pytest.raises(ValueError):  # an entry more than the op declares is a provider's bug
        RMSNORM.outputs((a, b))
