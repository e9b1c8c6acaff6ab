"""Descriptors are checked against their op when a backend loads: a field the op lacks quarantines it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

import magi2_core as m2
from magi2_core.cli import app
from magi2_core.model.backend_spec import BackendSpec
from magi2_core.model.capability import Capability, Condition, IntRange, Provenance, Rule
from magi2_core.selection.registry import Registry
from magi2_core.testing import InProcessBackend

_RULE = Rule(
    id="few-experts",
    when=(Condition(field="num_experts", op="lt", value=8),),
    reason="test",
    provenance=Provenance(kind="policy", source="this test"),
)


def _backend(name: str, *caps: Capability) -> InProcessBackend:
    return InProcessBackend(BackendSpec(name=name, version="1", core_api=">=2.0,<3", providers=caps))


def _attention(name: str = "attn_ok", **extra: object) -> Capability:
    return Capability(op="attention", name=name, impl="x:y", device_types=("cpu",), dtypes=("float32",), **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cap", "field"),
    [
        (_attention("attn_range", ranges=(IntRange(field="num_experts", min=1),)), "num_experts"),
        (_attention("attn_rule", rules=(_RULE,)), "num_experts"),
        (_attention("attn_out", out_dtypes=("float32",)), "out_dtype"),
        (
            Capability(
                op="rmsnorm", name="norm_heads", impl="x:y", device_types=("cpu",), dtypes=("float32",), head_dims=(64,)
            ),
            "head_dim",
        ),
        (
            Capability(
                op="moe_route",
                name="route_inter",
                impl="x:y",
                device_types=("cpu",),
                dtypes=("float32",),
                ranges=(IntRange(field="intermediate", max=1024),),
            ),
            "intermediate",
        ),
    ],
)
def test_a_field_the_op_lacks_quarantines_the_backend_with_the_reason(cap: Capability, field: str) -> None:
    reg = Registry(discover=False)
    reg.register(_backend("fine", _attention()), name="fine")
    reg.register(_backend("wrong", _attention("attn_sibling"), cap), name="wrong")
    (item,) = reg.quarantined()
    assert item.entry_point == "wrong"
    assert f"{cap.op}:{cap.name}" in item.reason and repr(field) in item.reason
    assert f"{cap.op} does not have" in item.reason
    # the whole backend is out, its consistent sibling included; other backends are untouched
    assert [p.name for p in reg.providers("attention")] == ["attn_ok"]


def test_fields_every_op_has_and_its_own_fields_are_accepted() -> None:
    reg = Registry(discover=False)
    moe_rule = Rule(
        id="few-experts",
        when=(
            Condition(field="num_experts", op="lt", value=8),
            Condition(field="device_index", op="eq", value=0),
            Condition(field="feature", op="in", value="deterministic"),
        ),
        reason="test",
        provenance=Provenance(kind="policy", source="this test"),
    )
    reg.register(
        _backend(
            "ok",
            Capability(
                op="moe_experts",
                name="experts",
                impl="x:y",
                device_types=("cpu",),
                dtypes=("float32",),
                ranges=(IntRange(field="intermediate", min=1), IntRange(field="tokens", max=10**6)),
                rules=(moe_rule,),
            ),
            _attention(head_dims=(64,), ranges=(IntRange(field="max_seqlen_q", min=1),)),
        ),
        name="ok",
    )
    assert reg.quarantined() == ()
    assert [p.name for p in reg.providers("moe_experts")] == ["experts"]


@pytest.fixture
def wrong_backend() -> Iterator[None]:
    reg = m2.get_registry()
    reg.register(
        _backend("magi2-wrong-fields", _attention("attn_experts", ranges=(IntRange(field="num_experts", min=1),))),
        name="wrong_fields",
    )
    yield
    reg.unregister("wrong_fields")


def test_magi2_backends_shows_the_quarantine(wrong_backend: None) -> None:
    result = CliRunner().invoke(app, ["backends", "--json"])
    assert result.exit_code == 0, result.output
    (item,) = [q for q in json.loads(result.stdout)["quarantined"] if q["entry_point"] == "wrong_fields"]
    assert "attention:attn_experts" in item["reason"] and "'num_experts'" in item["reason"]
    table = CliRunner().invoke(app, ["backends"])
    assert table.exit_code == 0 and "wrong_fields" in table.stdout
