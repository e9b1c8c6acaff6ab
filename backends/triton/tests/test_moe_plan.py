"""The fused MoE's plan as data (moe/plan.py): every shipped row, the device match, the launcher, explain.

The rows must repeat the choices the launcher made before they existed: `_previous_choice` below is
that decision as it was written then (the tile table and the launcher's five overrides), and every
shipped row must be the plan of some problem of a grid on which plan and previous choice agree.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from importlib.resources import files
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from magi2_backend_reference.moe import exact_moe_experts
from magi2_backend_triton.moe import MoEState, gluon, tma
from magi2_backend_triton.moe import plan as mp
from magi2_backend_triton.moe.fused import call_problem, run_fused, run_plan
from magi2_backend_triton.moe.pack import pack_w13
from magi2_backend_triton.moe.tiles import SliceTile
from magi2_backend_triton.providers import triton_moe_experts
from test_moe_fused import INTERPRET, assert_within_one_ulp, make_moe, two_kernel_plan
from typer.testing import CliRunner

from magi2_core.cli import app
from magi2_core.errors import InvalidValueError
from magi2_core.model.kernel import Planned
from magi2_core.model.plan import Plan
from magi2_core.model.problem import Feature, Problem
from magi2_core.model.virtual_device import VirtualDevice

H200 = mp.DeviceId("cuda", "NVIDIA H200", (9, 0))
H20 = mp.DeviceId("cuda", "NVIDIA H20", (9, 0))
H100 = mp.DeviceId("cuda", "NVIDIA H100 80GB HBM3", (9, 0))
TUNED = {"nvidia-h100"}  # fragments shipped from a `magi2 tune`: measured choices, not the previous ones
DEVICES = {
    "h200": H200,
    "h20": H20,  # an unknown 9.x device: the generic 9.x rows
    "h200-other-capability": mp.DeviceId("cuda", "NVIDIA H200", (9, 1)),  # name alone does not match
    "a100": mp.DeviceId("cuda", "NVIDIA A100-SXM4-80GB", (8, 0)),
    "cuda-unknown": mp.DeviceId("cuda", None, None),  # explain --device cuda on a host without one
    "musa": mp.DeviceId("musa", "MTT S5000", None),
    "cpu": mp.DeviceId("cpu", None, None),
}


# ---- the previous decision, as the launcher wrote it ---------------------------------------------


def _gemm(bm: int, bn: int, bk: int, w: int, s: int, g: int = 8) -> tuple[int, ...]:
    return bm, bn, bk, w, s, g


def _tiles(
    g1: tuple[int, ...],
    g2: tuple[int, ...],
    *,
    packed: bool = True,
    single: tuple[int, ...] | None = None,
    inter: bool = False,
    variant: str = "one_kernel",
) -> dict[str, Any]:
    return {"g1": g1, "g2": g2, "packed": packed, "single": single, "inter": inter, "variant": variant}


_UPSTREAM_CUDA = _tiles(_gemm(128, 128, 32, 4, 3, 16), _gemm(128, 128, 32, 4, 3, 16))
_UPSTREAM_MUSA = _tiles(_gemm(128, 128, 64, 16, 1, 16), _gemm(128, 128, 64, 16, 1, 16))
_SMALL, _MID = (_gemm(16, 32, 64, 4, 4), _gemm(16, 64, 64, 4, 4)), (_gemm(64, 128, 32, 4, 4), _gemm(64, 128, 64, 4, 3))
_LARGE = (_gemm(128, 128, 32, 8, 4), _gemm(128, 256, 64, 8, 3))
_H200 = (
    (
        16.0,
        [
            _tiles(*_SMALL, single=(64, 32, 4, 3), inter=True, variant="gluon_routed"),
            _tiles(*_SMALL, single=(64, 32, 4, 3), inter=True, variant="gluon"),
            _tiles(*_SMALL, single=(16, 32, 4, 4)),
        ],
    ),
    (
        64.0,
        [
            _tiles(*_MID, single=(64, 32, 4, 3), inter=True, variant="gluon_routed"),
            _tiles(*_MID, single=(64, 32, 4, 3), inter=True),
        ],
    ),
    (
        math.inf,
        [
            _tiles(*_LARGE, single=(128, 32, 8, 3), inter=True, variant=v)
            for v in ("gluon_ws", "gluon", "tma", "one_kernel")
        ],
    ),
)
_FP32 = _tiles(_gemm(32, 64, 32, 4, 2), _gemm(32, 64, 32, 4, 2))
_INTERPRETER = _tiles(_gemm(16, 16, 16, 4, 1), _gemm(16, 16, 16, 4, 1), single=(16, 32, 4, 1), inter=True)


def _previous_choice(device: mp.DeviceId, problem: Problem, has_gluon: bool, has_desc: bool) -> tuple[Any, ...]:
    """(variant, tile, align) as `tiles.select_tiles` and `fused.run_fused` chose them before plan rows."""
    t, hl, e, k, d, i = (
        problem.tokens,
        problem.num_heads,
        problem.num_experts,
        problem.top_k,
        problem.hidden,
        problem.intermediate,
    )
    assert None not in (t, hl, e, k, d, i)
    det = Feature.DETERMINISTIC in problem.features
    interp = device.type == "cpu"

    def buildable(tiles: dict[str, Any]) -> bool:
        if tiles["variant"] == "one_kernel":
            return True
        if not tiles["variant"].startswith("gluon"):
            return has_desc
        return (
            has_gluon
            and gluon.gluon_shape_reason(d, i, torch.bfloat16, SliceTile(*tiles["single"]), tiles["variant"]) is None
        )

    if device.type == "cpu":
        tiles = _INTERPRETER
    elif problem.dtype == "float32":
        tiles = _FP32
    elif device.type == "musa":
        tiles = _UPSTREAM_MUSA
    elif device.type == "cuda" and device.capability is not None and device.capability[0] == 9:
        rpe = t * k / e
        tiles = next(next(c for c in choices if buildable(c)) for bound, choices in _H200 if rpe <= bound)
    else:
        tiles = _UPSTREAM_CUDA
    single = tiles["single"]
    if single is not None and (d & (d - 1) != 0 or i % single[1] != 0):
        single = None
    tma_path = single is not None and tiles["variant"] != "one_kernel"  # eager, raw weights: the bank exists
    variant = tiles["variant"]
    if variant == "gluon_routed" and (det or 4 * hl * e * t * k > mp.LIST_BUDGET):
        variant = "gluon"
    if not (device.type == "cuda" and not interp):
        align = "stable_torch" if det else "atomic"
    else:
        align = "stable_kernels" if det or hl * e <= mp.STABLE_KERNELS_MAX_EXPERTS else "atomic"
    if tma_path and variant == "gluon_routed":
        align = "lists"
    if single is None:
        g1, g2 = tiles["g1"], tiles["g2"]
        tile = {"BLOCK_M": g1[0]} | {
            f"{key}{n}": v
            for n, g in ((1, g1), (2, g2))
            for key, v in zip(("BLOCK_N", "BLOCK_K", "num_warps", "num_stages", "GROUP_M"), g[1:], strict=True)
        }
        return "two_kernel", tile | {"PACKED_W13": int(tiles["packed"])}, align
    tile = dict(zip(("BLOCK_M", "BLOCK_I", "num_warps", "num_stages"), single, strict=True))
    return (
        (variant if tma_path else "one_kernel"),
        tile | {"PACKED_W13": int(tiles["packed"]), "INTERLEAVED": int(tiles["inter"])},
        align,
    )


def _shipped() -> dict[str, tuple[mp.PlanRow, ...]]:
    """This backend's fragments (``BackendSpec.profiles``, as the core read them): name -> its rows."""
    from magi2_core.profiles import backend_fragments

    frags = [f for f in backend_fragments() if f.backend == "magi2-backend-triton"]
    return {
        f.profile.name: tuple(mp.PlanRow.of(r) for r in f.profile.plans_for("moe_experts", "triton")) for f in frags
    }


def _fragment(device: mp.DeviceId) -> str:
    """The name of the shipped fragment whose rows ``device`` reads (the core's choice, from the rows' source)."""
    return mp.rows_for(device)[1].split(" (")[0].split()[-1]


def _normal(plan: Plan) -> tuple[Any, ...]:
    flags = {"PACKED_W13": 1} | ({} if plan.variant == "two_kernel" else {"INTERLEAVED": 1})
    return plan.variant, flags | plan.tile, plan.align


@pytest.fixture
def off_interpreter(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Decide as on a real device: no interpreter, and this Triton's Gluon and descriptors as the test says."""

    def setup(interpreting: bool, has_gluon: bool, has_desc: bool) -> None:
        for module in (mp, gluon, tma):
            monkeypatch.setattr(module, "interpreting" if module is mp else "_interpreting", lambda: interpreting)
        monkeypatch.setattr(gluon, "gluon_import_error", lambda: None if has_gluon else "no Gluon in this Triton")
        monkeypatch.setattr(tma, "_HAS_DESCRIPTORS", has_desc)

    yield setup


def _grid(device: mp.DeviceId) -> Iterator[Problem]:
    shapes = [(256, 1280), (128, 96), (32, 48), (192, 1280), (64, 80), (128, 64)]
    sizes = [(3, 256, 6), (12, 256, 6), (1, 8, 3), (2, 64, 2)]
    for dtype in ("bfloat16", "float16", "float32"):
        for det in (False, True):
            for d, i in shapes:
                for hl, e, k in sizes:
                    for t in (1, 29, 512, 682, 683, 2048, 2730, 2731, 4096, 14601):
                        yield Problem(
                            op="moe_experts",
                            device_type=device.type,
                            dtype=dtype,
                            tokens=t,
                            num_heads=hl,
                            num_experts=e,
                            top_k=k,
                            hidden=d,
                            intermediate=i,
                            features=frozenset({Feature.DETERMINISTIC} if det else ()),
                        )


def test_every_shipped_row_is_a_plan_and_the_plans_repeat_the_previous_choices(off_interpreter: Any) -> None:
    reached: set[tuple[str, int]] = set()
    for label, device in DEVICES.items():
        rows, source = mp.rows_for(device)
        frag = _fragment(device)
        for has_gluon, has_desc in ((True, True), (False, True), (False, False)):
            off_interpreter(device.type == "cpu", has_gluon, has_desc)
            for problem in _grid(device):
                plan, _ = mp.plan_for(problem, device, rows, source)
                expected = _previous_choice(device, problem, has_gluon, has_desc)
                assert _normal(plan) == expected, (label, has_gluon, has_desc, problem, plan.why)
                row = int(plan.why.split("; row ")[1].split(" ")[0])
                assert rows[row - 1].plan.variant == plan.variant
                reached.add((frag, row))
    shipped = {(name, i) for name, rows in _shipped().items() if name not in TUNED for i in range(1, len(rows) + 1)}
    assert shipped - reached == set(), "shipped rows no problem reaches"


def test_a_device_matches_its_named_fragment_by_name_and_capability_else_the_generic_rows() -> None:
    devices = {**DEVICES, "h100": H100}
    names = {label: _fragment(dev) for label, dev in devices.items()}
    assert names == {
        "h200": "nvidia-h200",
        "h100": "nvidia-h100",
        "h20": "generic-cuda-sm90",
        "h200-other-capability": "generic-cuda-sm90",
        "a100": "generic-cuda",
        "cuda-unknown": "generic-cuda",
        "musa": "generic-musa",
        "cpu": "generic-cpu",
    }
    _, measured = mp.rows_for(H200)
    _, generic = mp.rows_for(H20)
    assert "measured on this device model" in measured and "magi2 tune" not in measured
    assert "no rows measured for cuda 'NVIDIA H20' 9.0" in generic and "magi2 tune" in generic


@pytest.fixture
def profile_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Iterator[Any]:
    """Set MAGI2_PROFILE (a file written from a dict, or a name) and re-read the configuration."""
    import magi2_core as m2

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def use(profile: dict[str, Any] | str) -> None:
        if isinstance(profile, dict):
            path = tmp_path / "tuned.json"
            path.write_text(json.dumps(profile))
            profile = str(path)
        monkeypatch.setenv("MAGI2_PROFILE", profile)
        m2.reload_config()

    yield use
    monkeypatch.delenv("MAGI2_PROFILE", raising=False)
    m2.reload_config()


def test_a_tuned_profiles_plan_rows_come_before_the_shipped_ones(off_interpreter: Any, profile_env: Any) -> None:
    off_interpreter(False, True, True)
    shipped_512 = mp.plan_for(_h200_problem(512), H200, *mp.rows_for(H200))[0]
    shipped_14601 = mp.plan_for(_h200_problem(14601), H200, *mp.rows_for(H200))[0]
    tile = dict(_shipped()["nvidia-h200"][0].plan.tile)  # the FP32 two-kernel tile
    profile_env(
        {
            "format": "magi2-profile",
            "version": 1,
            "name": "tuned-nvidia-h200",
            "device": {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0"},
            "provenance": {"kind": "tune", "source": "magi2 tune on cuda NVIDIA H200"},
            "plans": [
                {
                    "op": "moe_experts",
                    "provider": "triton",
                    "id": "tune-1",
                    "when": [
                        {"field": "dtype", "op": "eq", "value": "bfloat16"},
                        {"field": "routes_per_expert", "op": "le", "value": 100},
                    ],
                    "plan": {"variant": "two_kernel", "tile": tile, "align": "atomic"},
                    "why": "measured fastest here",
                },
                {
                    "op": "moe_experts",
                    "provider": "triton",
                    "id": "broken",
                    "plan": {"variant": "two_kernel", "tile": {"BLOCK_M": 32}, "align": "atomic"},
                    "why": "hand-edited",
                },
                {"op": "moe_experts", "provider": "other", "plan": {"x": 1}, "why": "another provider's row"},
            ],
        }
    )
    rows, source = mp.rows_for(H200)
    shipped = _shipped()["nvidia-h200"]
    assert rows[0].plan.variant == "two_kernel" and len(rows) == 1 + len(shipped) and rows[1:] == shipped
    assert "profile tuned-nvidia-h200 (env: " in source and "rows 1-1, then profile nvidia-h200" in source
    plan = mp.plan_for(_h200_problem(512), H200, rows, source)[0]  # 12 routes per expert: the tuned row
    shipped = (shipped_512.variant, shipped_512.align, shipped_512.tile)
    assert (plan.variant, plan.align, plan.tile) == ("two_kernel", "atomic", tile) != shipped
    assert "row 1 (dtype == 'bfloat16' and routes_per_expert <= 100): measured fastest here" in plan.why
    # 343 routes per expert: no tuned row matches, the shipped rows decide as before
    assert mp.plan_for(_h200_problem(14601), H200, rows, source)[0].describe() == shipped_14601.describe()


def test_the_launchers_plans_are_dropped_with_the_configuration() -> None:
    from magi2_backend_triton.moe import fused

    import magi2_core as m2

    fused._planned(torch.device("cpu"), torch.float32, False, True, False, 16, 1, 4, 2, 32, 64)
    assert fused._planned.cache_info().currsize >= 1
    m2.reload_config()  # MAGI2_PROFILE may have changed: the plans follow the profile read now
    assert fused._planned.cache_info().currsize == 0


def test_the_generic_profile_takes_the_generic_rows_even_on_the_h200(profile_env: Any) -> None:
    profile_env("generic")
    rows, source = mp.rows_for(H200)
    assert source.startswith("generic rows generic-cuda-sm90") and rows == mp.rows_for(H20)[0]
    profile_env("nvidia-h200")
    assert mp.rows_for(H200)[1].startswith("profile nvidia-h200 (magi2_backend_triton/profiles/nvidia-h200.json")


def test_the_generic_sm90_rows_are_the_h200_rows_the_rule_keeps_with_their_own_provenance() -> None:
    frags = _shipped()
    h200, generic = frags["nvidia-h200"], frags["generic-cuda-sm90"]
    left = iter([(r.when, r.plan) for r in h200])
    assert all(any(g == h for h in left) for g in [(r.when, r.plan) for r in generic])  # in order, none new
    assert generic[-1].plan.variant == "two_kernel" and generic[-1].when == ()  # any problem can run it
    for row in generic:
        assert row.provenance is not None
        if row.provenance.kind == "benchmark":  # judged on both devices (scripts/generic_hopper_rows.py)
            assert "NVIDIA H200" in row.provenance.note and "NVIDIA H100 80GB HBM3" in row.provenance.note
        else:
            assert row.provenance.kind == "policy" and "unmeasured" in row.provenance.note


def _tune_point(tokens: int, heads: int, deterministic: bool = False) -> Problem:
    return Problem(
        op="moe_experts",
        device_type="cuda",
        dtype="bfloat16",
        tokens=tokens,
        num_heads=heads,
        num_experts=256,
        top_k=6,
        hidden=256,
        intermediate=1280,
        features=frozenset({Feature.DETERMINISTIC} if deterministic else ()),
    )


def test_the_h100_runs_its_tunes_plans_then_the_generic_rows(off_interpreter: Any) -> None:
    off_interpreter(False, True, True)
    frags = _shipped()
    h100, generic = frags["nvidia-h100"], frags["generic-cuda-sm90"]
    tuned = [r for r in h100 if r.provenance is not None and r.provenance.kind == "tune"]
    assert h100 == (*tuned, *generic) and len(tuned) == 8
    rows, source = mp.rows_for(H100)
    assert rows == h100 and source.startswith("profile nvidia-h100 (magi2_backend_triton/profiles/nvidia-h100.json")
    expected = {  # the tune's fastest plan per point (benchmarks/results/tuning/profile_tuned_h100_e6abbd8.json)
        (512, 3, False): ("gluon_routed", 64, "lists"),
        (512, 12, False): ("gluon_routed", 64, "lists"),
        (4096, 3, False): ("gluon_ws", 128, "atomic"),
        (4096, 12, False): ("gluon", 128, "atomic"),
        (14601, 3, False): ("gluon_ws", 128, "stable_kernels"),
        (14601, 12, False): ("gluon_ws", 128, "atomic"),
        (4096, 3, True): ("gluon_ws", 128, "stable_kernels"),
        (4096, 12, True): ("gluon", 128, "stable_kernels"),
    }
    for (t, h, det), (variant, block_m, align) in expected.items():
        plan = mp.plan_for(_tune_point(t, h, det), H100, rows, source)[0]
        assert (plan.variant, plan.tile["BLOCK_M"], plan.align) == (variant, block_m, align), plan.why
        assert "measured by `magi2 tune` on an NVIDIA H100 80GB HBM3" in plan.why
    other = mp.plan_for(_tune_point(4096, 6), H100, rows, source)[0]  # 6 heads: no tuned row, a generic one
    assert f"; row {len(tuned) + 10} (every call)" in other.why and other.variant == "gluon_ws"


def test_a_shipped_fragment_with_a_malformed_row_is_refused_naming_the_row(monkeypatch: pytest.MonkeyPatch) -> None:
    import magi2_core as m2
    from magi2_core.errors import ProfileError
    from magi2_core.profiles import Fragment, backend_fragments, loads_profile

    data = json.loads((files("magi2_backend_triton") / "profiles" / "generic-cpu.json").read_text())
    data["plans"][1]["plan"]["tile"].pop("BLOCK_K2")
    data["plans"].append({"op": "rmsnorm", "provider": "triton", "plan": {}, "why": "another op's row: not read"})
    broken = Fragment(loads_profile(json.dumps(data), "x.json"), "x.json", "magi2-backend-triton", "x/x.json")
    others = [f for f in backend_fragments() if f.profile.name != "generic-cpu"]
    monkeypatch.setattr("magi2_core.profiles.active._backend_fragments", lambda: (*others, broken))
    m2.reload_config()
    try:
        with pytest.raises(ProfileError, match=r"x\.json.*plans row 2 of triton for moe_experts: .*BLOCK_K2"):
            mp.rows_for(mp.DeviceId("cpu", None, None))
    finally:
        monkeypatch.undo()
        m2.reload_config()
    assert mp.row_error(loads_profile(json.dumps(data), "x.json").plans[0]) is None  # the rows as shipped


def _h200_problem(tokens: int, heads: int = 3, deterministic: bool = False) -> Problem:
    return Problem(
        op="moe_experts",
        device_type="cuda",
        dtype="bfloat16",
        tokens=tokens,
        num_heads=heads,
        num_experts=256,
        top_k=6,
        hidden=256,
        intermediate=1280,
        features=frozenset({Feature.DETERMINISTIC} if deterministic else ()),
    )


@pytest.mark.parametrize(
    ("tokens", "heads", "det", "variant", "align"),
    [
        (512, 3, False, "gluon_routed", "lists"),
        (512, 3, True, "gluon", "stable_kernels"),
        (2048, 3, False, "gluon_routed", "lists"),
        (2048, 12, False, "gluon", "atomic"),  # 151 MB of lists; 3072 experts
        (4096, 3, False, "gluon_ws", "stable_kernels"),
        (14601, 3, True, "gluon_ws", "stable_kernels"),
        (4096, 12, False, "gluon_ws", "atomic"),
    ],
)
def test_the_h200_production_plans(
    off_interpreter: Any, tokens: int, heads: int, det: bool, variant: str, align: str
) -> None:
    off_interpreter(False, True, True)
    plan, _ = mp.plan_for(_h200_problem(tokens, heads, det), H200, *mp.rows_for(H200))
    assert (plan.variant, plan.align) == (variant, align)
    if (tokens, heads) == (2048, 12):
        assert "route lists need" in plan.why and "atomic kernels are faster" in plan.why


def test_route_list_budget_passes_the_per_expert_kernel_over(
    off_interpreter: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    off_interpreter(False, True, True)
    monkeypatch.setattr(mp, "LIST_BUDGET", 4 * 768 * 512 * 6 - 1)  # one byte short at T = 512, 3 heads
    plan, _ = mp.plan_for(_h200_problem(512), H200, *mp.rows_for(H200))
    assert plan.variant == "gluon" and "row 2 (gluon_routed): its route lists need" in plan.why


def test_the_raw_weights_step_reads_them_in_place(off_interpreter: Any) -> None:
    off_interpreter(False, True, True)
    problem = _h200_problem(512)
    plan, _ = mp.plan_for(problem, H200, *mp.rows_for(H200))
    captured, launch = mp.without_bank(plan, problem, H200)
    assert (captured.variant, captured.align) == ("one_kernel", "stable_kernels")
    assert captured.tile == plan.tile | {"PACKED_W13": 0, "INTERLEAVED": 0} and not launch.packed_w13
    assert captured.why.startswith(plan.why) and "raw gate/up have no packed bank" in captured.why
    two = two_kernel_plan(align="atomic")
    assert mp.without_bank(two, problem, H200)[0].tile == two.tile | {"PACKED_W13": 0}
    bare = two_kernel_plan(align="atomic", PACKED_W13=0)
    assert mp.without_bank(bare, problem, H200)[0] is bare  # nothing to change


# ---- on the CPU, through the interpreter -----------------------------------------------------------


@pytest.mark.skipif(not INTERPRET, reason="interpreter test")
def test_run_fused_follows_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    from magi2_backend_triton.moe import fused

    x, probs, idx, wg, wu, wd = make_moe(9, 2, 3, 32, 64, 2)
    problem = call_problem(x, idx, wg, False)
    bank = pack_w13(wg, wu)  # prepared weights run the plan as it is; raw ones its raw step
    gate, up = bank[:, 0::2].transpose(1, 2), bank[:, 1::2].transpose(1, 2)
    run = run_fused(x, probs, idx, gate, up, wd, state=MoEState())
    assert run.plan == triton_moe_experts.plan(problem)
    raw = run_fused(x, probs, idx, wg, wu, wd, state=MoEState()).plan
    assert raw == mp.without_bank(run.plan, problem, mp.device_id("cpu", None))[0]
    assert run.buffers is not None and run.buffers.block_m == run.plan.tile["BLOCK_M"] and run.inter is None
    # other rows, other kernels: the launcher runs what the rows say
    row = mp.PlanRow(plan=mp.RowPlan(variant="two_kernel", tile=two_kernel_plan(bm=32).tile, align="device"), why="t")
    monkeypatch.setattr(fused, "rows_for", lambda device: ((row,), "test rows"))
    fused._planned.cache_clear()
    try:
        run = run_fused(x, probs, idx, wg, wu, wd, state=MoEState())
    finally:
        fused._planned.cache_clear()
    assert run.plan is not None and run.plan.variant == "two_kernel" and run.plan.why.startswith("test rows; row 1")
    assert run.inter is not None and run.buffers is not None and run.buffers.block_m == 32
    assert_within_one_ulp(run.y, exact_moe_experts(x, probs, idx, wg, wu, wd))


@pytest.mark.skipif(not INTERPRET, reason="interpreter test")
@pytest.mark.parametrize("deterministic", [False, True])
def test_plan_candidates_all_run_and_meet_the_contract(deterministic: bool) -> None:
    # The CPU's rows, and the H200's rows decided for the CPU (the kernels the interpreter runs: one_kernel
    # tiles of 16, 64 and 128 rows, the TMA kernel where this Triton has descriptors, two-kernel tiles).
    x, probs, idx, wg, wu, wd = make_moe(9, 2, 3, 32, 64, 2)
    problem = call_problem(x, idx, wg, deterministic)
    cpu = mp.device_id("cpu", None)
    plans = list(triton_moe_experts.plan_candidates(problem))
    assert plans[0] == triton_moe_experts.plan(problem)
    h200_rows = mp.rows_for(H200)[0]
    plans += mp.candidates_for(problem, cpu, h200_rows, "h200 rows")[1:]
    kinds = {(p.variant, tuple(sorted(p.tile.items())), p.align) for p in plans}
    assert len(kinds) == len(plans) >= 6
    assert {p.variant for p in plans} >= {"one_kernel", "two_kernel"}
    assert all(p.align == ("stable_torch" if deterministic else "atomic") for p in plans)
    ref = exact_moe_experts(x, probs, idx, wg, wu, wd)
    for plan in plans:
        assert mp.plan_reason(plan, problem, cpu) is None
        assert_within_one_ulp(run_plan(x, probs, idx, wg, wu, wd, plan, deterministic=deterministic), ref)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test")
def test_run_plan_refuses_a_plan_that_cannot_serve_the_call() -> None:
    x, probs, idx, wg, wu, wd = make_moe(9, 2, 3, 32, 48, 2)
    with pytest.raises(InvalidValueError, match="deterministic mode needs a stable route order"):
        run_plan(x, probs, idx, wg, wu, wd, two_kernel_plan(align="atomic"), deterministic=True)
    base_plan = Plan(
        variant="one_kernel",
        tile={"BLOCK_M": 16, "BLOCK_I": 32, "num_warps": 4, "num_stages": 1},
        align="atomic",
        why="t",
    )
    with pytest.raises(InvalidValueError, match="intermediate a multiple of BLOCK_I 32"):
        run_plan(x, probs, idx, wg, wu, wd, base_plan)
    with pytest.raises(InvalidValueError, match="stable alignment kernels run on CUDA"):
        run_plan(x, probs, idx, wg, wu, wd, two_kernel_plan(align="stable_kernels"))
    with pytest.raises(InvalidValueError, match=r"plan\.tile"):
        run_plan(x, probs, idx, wg, wu, wd, Plan(variant="two_kernel", tile={"BLOCK_M": 16}, align="atomic", why=""))


def test_the_kernel_object_is_planned() -> None:
    assert isinstance(triton_moe_experts, Planned)


@pytest.mark.skipif(not INTERPRET, reason="interpreter test")
@pytest.mark.parametrize("json_out", [False, True])
def test_explain_shows_the_plan_and_why(json_out: bool) -> None:
    args = [
        "explain",
        "moe_experts",
        "--device",
        "cpu",
        "--tokens",
        "29",
        "--moe-heads",
        "2",
        "--experts",
        "8",
        "--top-k",
        "3",
        "--hidden",
        "32",
        "--intermediate",
        "48",
        "--provider",
        "triton",
    ]
    result = CliRunner().invoke(app, args + (["--json"] if json_out else []))
    assert result.exit_code == 0, result.output
    if json_out:
        plan = json.loads(result.output)["plan"]
        assert plan["variant"] == "two_kernel" and "passed over row 1 (one_kernel)" in plan["why"]
    else:
        assert "plan (triton): two_kernel (BLOCK_M=16, " in result.output
        assert "why: generic rows generic-cpu" in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("name", "capability", "source", "variant"),
    [
        ("NVIDIA H200", "9.0", "profile nvidia-h200 (magi2_backend_triton/profiles/nvidia-h200.json", "gluon_ws"),
        (
            "NVIDIA H100 80GB HBM3",
            "9.0",
            "profile nvidia-h100 (magi2_backend_triton/profiles/nvidia-h100.json",
            "gluon_ws",
        ),
        ("NVIDIA H100 PCIe", "9.0", "generic rows generic-cuda-sm90", "gluon_ws"),
        ("NVIDIA B200", "10.0", "generic rows generic-cuda (", "two_kernel"),  # Gluon is Hopper's wgmma: not here
    ],
)
def test_plan_on_a_described_device_is_the_plan_that_device_runs(
    off_interpreter: Any, name: str, capability: str, source: str, variant: str
) -> None:
    """``magi2 explain --device-name`` on a host without that GPU: the rows and plan of that device."""
    off_interpreter(False, True, True)
    device = VirtualDevice(type="cuda", name=name, capability=capability)
    plan = triton_moe_experts.plan_on(_h200_problem(4096), device)
    dev = mp.DeviceId("cuda", name, tuple(int(p) for p in capability.split(".")))  # type: ignore[arg-type]
    assert plan == mp.plan_for(_h200_problem(4096), dev, *mp.rows_for(dev))[0]
    assert plan.why.startswith(source) and plan.variant == variant, plan.why
    if name == "NVIDIA H200":  # a profile given in place of MAGI2_PROFILE reaches the plan too
        generic = triton_moe_experts.plan_on(_h200_problem(4096), device.model_copy(update={"profile": "generic"}))
        assert generic.why.startswith("generic rows generic-cuda-sm90")


def test_the_moe_modules_import_one_another_without_a_cycle() -> None:
    # Every import between the package's modules, at module level or inside a function, relative or
    # absolute: the graph must be acyclic (tiles.py once imported gluon.py, which imports tiles.py).
    import ast
    import graphlib
    from pathlib import Path

    import magi2_backend_triton.moe as pkg

    folder = Path(pkg.__file__).parent
    names = {p.stem for p in folder.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in folder.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level == 1 or mod.startswith("magi2_backend_triton.moe"):
                    head = mod.removeprefix("magi2_backend_triton.moe").lstrip(".").split(".")[0]
                    deps |= {head} if head else {a.name for a in node.names if a.name in names}
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
                deps |= {a.value.lstrip(".") for a in node.args if isinstance(a, ast.Constant)} & names
        graph[path.stem] = deps & names - {path.stem}
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the cycle
    assert "gluon" not in graph["tiles"] and "plan" in graph["fused"]
