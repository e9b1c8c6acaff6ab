"""The learned-sink correction is contributed by backends and chosen by the core, once per device type."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import magi2_core as m2
from magi2_core.cli import app
from magi2_core.model.backend_spec import BackendSpec, Setting, SinkCorrectionSpec
from magi2_core.selection import registry
from magi2_core.selection.registry import Registry
from magi2_core.sink_correction.choice import sink_correction_for
from magi2_core.sink_correction.reference import apply_sink_correction, sink_correction

# A real callable with the SinkCorrectionFn signature, for descriptors that must import.
CORE_IMPL = "magi2_core.sink_correction.reference:apply_sink_correction"


def _contributor(dist: str, *corrections: Any, settings: tuple[Setting, ...] = ()) -> Callable[[], BackendSpec]:
    """What an entry point names: the spec is built when the registry calls it (a bad one is quarantined)."""
    return lambda: BackendSpec(
        name=dist, version="0", core_api=">=2.0,<3", providers=(), sink_corrections=corrections, settings=settings
    )


# A backend's setting that forces the correction on MUSA, as magi2-backend-musa-mate's does.
TOY_FORCE = Setting(
    name="MAGI2_TOY_SINK_CORRECTION",
    kind="choice",
    choices=("torch", "triton"),
    default="torch",
    help="the toy MUSA backend's sink correction",
    forces_sink_correction_on="musa",
)


def _spec(name: str, impl: str = CORE_IMPL, device_types: tuple[str, ...] = ("cuda",), priority: int = 10) -> Any:
    return SinkCorrectionSpec(name=name, impl=impl, device_types=device_types, priority=priority)


@pytest.fixture
def reg(monkeypatch: pytest.MonkeyPatch) -> Registry:
    """An empty process registry for the test (the facility reads the process-wide one)."""
    fresh = Registry(discover=False)
    monkeypatch.setattr(registry, "_REGISTRY", fresh)
    monkeypatch.delenv("MAGI2_MATE_SINK_CORRECTION", raising=False)
    m2.reload_config()
    return fresh


def test_without_contributions_every_device_gets_the_torch_correction(reg: Registry) -> None:
    for device_type in ("cpu", "cuda", "musa"):
        chosen = sink_correction_for(device_type)
        assert chosen.name == "torch" and chosen.apply is apply_sink_correction
    assert "no contributed correction declares cuda" in sink_correction_for("cuda").detail


def test_highest_priority_importable_correction_for_the_device_type(reg: Registry) -> None:
    reg.register(
        _contributor("fast-dist", _spec("fast", priority=5), _spec("broken", impl="no_such_module_xyz:fn", priority=9)),
        "fast",
    )
    chosen = sink_correction_for("cuda")
    assert chosen.name == "fast" and "fast-dist" in chosen.detail
    assert sink_correction_for("cuda") is chosen  # chosen once
    assert sink_correction_for("cpu").name == "torch"  # "fast" does not declare the CPU
    reg.unregister("fast")  # a registry change: chosen again
    assert sink_correction_for("cuda").name == "torch"


def test_a_correction_that_does_not_import_is_skipped_with_its_reason(reg: Registry) -> None:
    reg.register(_contributor("ghost-dist", _spec("ghost", impl="no_such_module_xyz:fn")), "ghost")
    chosen = sink_correction_for("cuda")
    assert chosen.name == "torch" and "no_such_module_xyz" in chosen.detail and "ghost" in chosen.detail


@pytest.mark.parametrize("bad", [_spec("torch"), {"name": "x", "impl": "not a path", "device_types": ["cuda"]}])
def test_a_bad_contribution_quarantines_only_that_backend(reg: Registry, bad: Any) -> None:
    reg.register(_contributor("good-dist", _spec("good")), "good")
    reg.register(_contributor("bad-dist", bad), "bad")
    reg.register(_contributor("twin-dist", _spec("good")), "twin")  # a name taken by another backend
    reasons = {q.entry_point: q.reason for q in reg.quarantined()}
    assert set(reasons) == {"bad", "twin"} and "already taken" in reasons["twin"]
    assert [c.name for c in reg.state().sink_corrections] == ["good"]
    assert sink_correction_for("cuda").name == "good"


def test_musa_correction_is_forced_by_a_backends_setting(reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "forced" not in sink_correction_for("musa").detail  # no backend forces it
    reg.register(_contributor("toy-musa", settings=(TOY_FORCE,)), "toy_musa")
    assert reg.state().forced_by == {"musa": "MAGI2_TOY_SINK_CORRECTION"}
    assert "forced by MAGI2_TOY_SINK_CORRECTION" in sink_correction_for("musa").detail  # default: torch
    monkeypatch.setenv("MAGI2_TOY_SINK_CORRECTION", "triton")
    m2.reload_config()
    with pytest.raises(m2.ConfigError, match=r"MAGI2_TOY_SINK_CORRECTION='triton'.*no installed backend"):
        sink_correction_for("musa")
    reg.register(_contributor("t-dist", _spec("triton")), "t")
    assert sink_correction_for("musa").name == "triton"  # forced although it declares only CUDA
    reg.unregister("toy_musa")
    assert reg.state().forced_by == {} and sink_correction_for("musa").name == "torch"


@pytest.mark.parametrize("rescale", ["fp32", "activation"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_torch_apply_is_the_validating_reference_bit_for_bit(rescale: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(31)
    o = torch.randn(11, 3, 16, generator=g).to(dtype)
    lse = torch.randn(3, 11, generator=g) * 4
    lse[1, 2] = float("-inf")
    sinks = torch.randn(2, 3, generator=g)
    want_o, want_lse = sink_correction(o, lse, sinks, rescale=rescale)  # type: ignore[arg-type]
    got_o, got_lse = apply_sink_correction(o, lse, sinks, rescale=rescale, return_lse=True)  # type: ignore[arg-type]
    assert got_lse is not None and torch.equal(got_lse, want_lse)
    assert torch.equal(got_o.view(torch.int16), want_o.view(torch.int16))
    assert apply_sink_correction(o, lse, sinks, rescale=rescale, return_lse=False)[1] is None  # type: ignore[arg-type]


def test_magi2_backends_says_which_correction_each_device_type_gets(reg: Registry) -> None:
    reg.register(_contributor("fast-dist", _spec("fast")), "fast")
    result = CliRunner().invoke(app, ["backends", "--json"])
    assert result.exit_code == 0, result.output
    chosen = json.loads(result.stdout)["sink_corrections"]
    assert chosen["cpu"]["name"] == "torch" and chosen["cuda"]["name"] == "fast"
    text = CliRunner().invoke(app, ["backends"])
    assert text.exit_code == 0 and "sink correction on cuda: fast" in text.stdout
