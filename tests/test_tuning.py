"""``magi2 tune`` on the CPU: the grid, --shapes errors, region cuts, a fake timer, resume, --show."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import magi2_core as m2
from magi2_core import BackendSpec, Capability, Feature
from magi2_core.cli import app
from magi2_core.errors import InvalidValueError
from magi2_core.model.plan import Plan
from magi2_core.model.problem import Problem
from magi2_core.ops.moe_experts import ExpertsCall
from magi2_core.ops.rmsnorm import RMSNormCall
from magi2_core.profiles import DeviceKey, load_profile, reset_profiles
from magi2_core.selection.registry import get_registry
from magi2_core.testing import InProcessBackend
from magi2_core.tools import timing
from magi2_core.tuning import tune
from magi2_core.tuning.grid import (
    AttentionShape,
    ExpertsShape,
    NormShape,
    RouteShape,
    default_grid,
    load_shapes,
    parse_shapes,
)
from magi2_core.tuning.measure import PlanResult, PointResult
from magi2_core.tuning.regions import cut, plan_rows, preference_rows
from magi2_core.tuning.session import partial_path

MOD = "magi2_tuning_toys"
CPU = DeviceKey("cpu", "toy cpu", None)


class FakeTimer:
    """Durations from ``cost(label)`` instead of a clock; each call still runs (the plumbing is real)."""

    def __init__(self, cost: Callable[[str], float]) -> None:
        self.cost = cost
        self.labels: list[str] = []

    def time(self, label: str, fn: Callable[[], object]) -> Callable[[], float]:
        fn()
        self.labels.append(label)
        ms = self.cost(label)
        return lambda: ms

    def synchronize(self) -> None:
        return None


def _norm(call: RMSNormCall) -> torch.Tensor:
    return call.x.to(call.out_dtype)


class Planned:
    """A moe_experts kernel object with two plans, timed through ``run_plan``."""

    PLANS = (
        Plan(variant="narrow", tile={"BLOCK": 16}, align="sorted", why="row 1"),
        Plan(variant="wide", tile={"BLOCK": 64}, align="sorted", why="candidate"),
    )

    def __init__(self) -> None:
        self.ran: list[str] = []

    def plan(self, problem: Problem) -> Plan:
        return self.PLANS[0]

    def plan_candidates(self, problem: Problem) -> Sequence[Plan]:
        return self.PLANS

    def run_plan(self, plan: Plan, x: torch.Tensor, *args: Any, deterministic: bool = False) -> torch.Tensor:
        self.ran.append(plan.variant)
        return x.clone()

    def __call__(self, call: ExpertsCall) -> torch.Tensor:
        return call.x.clone()


@pytest.fixture(autouse=True)
def toys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[types.ModuleType]:
    """Two rmsnorm providers and a planned moe_experts provider on the CPU; no user profile of this machine."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MAGI2_PROFILE", raising=False)
    get_registry().state()  # the backends load under the session's environment (and stay so for other tests)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # no Triton provider on the CPU: only the toys compete
    mod = types.ModuleType(MOD)
    mod.norm = _norm  # type: ignore[attr-defined]
    mod.planned = Planned()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, MOD, mod)
    caps = (
        Capability(
            op="rmsnorm",
            name="toy_a",
            impl=f"{MOD}:norm",
            device_types=("cpu",),
            dtypes=("float32",),
            out_dtypes=("float32",),
            priority=5,
        ),
        Capability(
            op="rmsnorm",
            name="toy_b",
            impl=f"{MOD}:norm",
            device_types=("cpu",),
            dtypes=("float32",),
            out_dtypes=("float32",),
            priority=4,
        ),
        Capability(
            op="moe_experts",
            name="toy_planned",
            impl=f"{MOD}:planned",
            device_types=("cpu",),
            dtypes=("float32",),
            features=frozenset({Feature.DETERMINISTIC}),
            priority=5,
        ),
    )
    reg = get_registry()
    reg.register(
        InProcessBackend(BackendSpec(name="tuning-toys", version="0", core_api=">=2.0,<3", providers=caps)),
        name="tuning_toys",
    )
    m2.reload_config()
    yield mod
    monkeypatch.undo()  # the environment as it was (TRITON_INTERPRET included) before the registry reloads
    reg.unregister("tuning_toys")
    m2.reload_config()
    reset_profiles()


def norm_points(*tokens: int) -> list[NormShape]:
    return [NormShape(op="rmsnorm", shape=(t, 16), dtype="float32") for t in tokens]


def toy_cost(label: str) -> float:
    """toy_a wins up to 64 tokens, toy_b above; every other provider is slow; the wide plan wins at 64 tokens."""
    point, _, name = label.partition("/")
    tokens = int(point.split()[1].split("x")[0].lstrip("T"))
    if name == "provider toy_a":
        return 1.0 if tokens <= 64 else 3.0
    if name == "provider toy_b":
        return 2.0
    if name.startswith("plan toy_planned#"):
        wide = name.endswith("#1")
        return 1.0 if wide == (tokens >= 64) else 1.5
    return 50.0


def test_the_default_grid_covers_the_production_shapes() -> None:
    grid = default_grid()
    ids = [p.id for p in grid]
    assert len(ids) == len(set(ids)) and 30 <= len(grid) <= 50
    att = [p for p in grid if isinstance(p, AttentionShape)]
    assert {p.lengths for p in att} >= {(32768,), (8192,) * 4, (14601,) * 2, (512,), (256,) * 16}
    assert any(p.sinks for p in att) and any(p.deterministic for p in att) and any(p.heads_kv == 8 for p in att)
    moe = {(p.tokens, p.heads) for p in grid if isinstance(p, ExpertsShape) and not p.deterministic}
    assert moe == {(t, h) for t in (512, 4096, 14601) for h in (3, 12)}
    assert any(isinstance(p, RouteShape) for p in grid) and sum(isinstance(p, NormShape) for p in grid) == 4


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"points": [{"op": "convolution", "tokens": 4}]}, r"points\[0\]: .*convolution"),
        (
            {"points": [{"op": "moe_experts", "tokens": 4, "heads": 3, "colour": 1}]},
            r"points\[0\]\.moe_experts\.colour",
        ),
        ({"points": [{"op": "moe_route", "tokens": 0}]}, r"points\[0\]\.moe_route\.tokens"),
        ({"points": [{"op": "rmsnorm", "shape": [8, 4]}, {"op": "rmsnorm", "shape": [8, 4]}]}, "repeated"),
        ({"points": []}, "non-empty list"),
        ({"points": [], "extra": 1}, "no other keys"),
        ({"points": [{"op": "attention", "lengths": [8], "heads_q": 6, "heads_kv": 4}]}, "multiple of heads_kv"),
    ],
    ids=["unknown-op", "unknown-key", "bad-value", "duplicate", "empty", "extra-key", "gqa"],
)
def test_a_bad_shapes_file_names_the_point_and_the_field(data: Any, message: str) -> None:
    with pytest.raises(InvalidValueError, match=message) as err:
        parse_shapes(data, "mine.json")
    assert "mine.json" in str(err.value)


def test_shapes_files_that_are_not_json_or_missing(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{points: ")
    with pytest.raises(InvalidValueError, match="not JSON"):
        load_shapes(tmp_path / "bad.json")
    with pytest.raises(InvalidValueError, match="readable JSON file"):
        load_shapes(tmp_path / "absent.json")
    (tmp_path / "ok.json").write_text(json.dumps([{"op": "moe_experts", "tokens": 4096, "heads": 12}]))
    (point,) = load_shapes(tmp_path / "ok.json")
    assert isinstance(point, ExpertsShape) and point.experts == 256 and point.id.startswith("moe_experts T4096 H12")


def test_cuts_are_geometric_means_between_neighbours() -> None:
    assert cut(64, 512) == 181 and cut(512, 4096) == 1448 and cut(1, 2) == 1
    with pytest.raises(ValueError):
        cut(4, 4)


def _result(
    tokens: int,
    times: dict[str, float],
    *,
    sinks: bool = False,
    kseg: int | None = None,
    plans: dict[str, float] | None = None,
) -> PointResult:
    problem = Problem(
        op="attention",
        device_type="cuda",
        dtype="bfloat16",
        tokens=tokens,
        max_seqlen_q=kseg or tokens,
        max_seqlen_k=kseg or tokens,
        num_heads_q=24,
        num_heads_kv=24,
        head_dim=128,
        features=frozenset({Feature.SINKS} if sinks else ()),
    )
    return PointResult(
        id=f"p{tokens}{'s' if sinks else ''}",
        op="attention",
        problem=problem,
        resolved=None,
        eligible=tuple(times),
        providers={k: {"p50": v, "p10": v, "p90": v} for k, v in times.items()},
        plans=tuple(
            PlanResult(provider="x", plan=Plan(variant=k, tile={}, align="a", why=""), ms={"p50": v})
            for k, v in (plans or {}).items()
        ),
    )


def test_regions_cut_between_winners_with_open_ends_and_pin_the_class() -> None:
    pts = [
        _result(512, {"a": 1.0, "b": 2.0}),
        _result(2048, {"a": 1.0, "b": 1.5}),
        _result(8192, {"a": 3.0, "b": 2.0}),
        _result(512, {"a": 5.0, "b": 1.0}, sinks=True),
    ]
    rows = preference_rows(pts, ["attention"])
    assert [r.prefer for r in rows] == [("a", "b"), ("b", "a"), ("b", "a")]
    short, long, sink = rows
    assert {(c.field, c.op, c.value) for c in sink.when} >= {("feature", "in", "sinks"), ("num_heads_q", "eq", 24)}
    assert [str(c) for c in short.when if c.field == "max_seqlen_k"] == ["max_seqlen_k <= 4096"]  # sqrt(2048*8192)
    assert not [c for c in long.when if c.field in ("max_seqlen_k", "tokens")]  # the last region is open above
    assert ("feature", "not_in", "sinks") in {(c.field, c.op, c.value) for c in long.when}
    assert "a 1 ms" in short.why and "magi2 tune" in short.why


def test_plan_regions_follow_routes_per_expert() -> None:
    def experts(tokens: int, best: str) -> PointResult:
        problem = Problem(
            op="moe_experts",
            device_type="cuda",
            dtype="bfloat16",
            tokens=tokens,
            num_heads=3,
            num_experts=256,
            top_k=6,
            hidden=256,
            intermediate=1280,
        )
        plans = tuple(
            PlanResult(
                provider="triton",
                plan=Plan(variant=v, tile={"BLOCK_M": 64}, align="atomic", why=""),
                ms={"p50": 1.0 if v == best else 2.0},
            )
            for v in ("gluon", "two_kernel")
        )
        return PointResult(
            id=f"e{tokens}",
            op="moe_experts",
            problem=problem,
            resolved="triton",
            eligible=("triton",),
            providers={"triton": {"p50": 1.0}},
            plans=plans,
        )

    rows = plan_rows([experts(512, "gluon"), experts(4096, "gluon"), experts(14601, "two_kernel")], "triton")
    assert [r.plan["variant"] for r in rows] == ["gluon", "two_kernel"]
    (bound,) = [c for c in rows[0].when if c.field == "routes_per_expert"]
    assert (bound.op, bound.value) == ("le", cut(96, 343))  # ceil(4096*6/256) = 96, ceil(14601*6/256) = 343
    assert preference_rows([experts(512, "gluon")], ["moe_experts"]) == []  # one provider: priority decides


def test_tune_with_a_fake_timer_is_deterministic_and_the_profile_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    points = [
        *norm_points(8, 64, 512),
        ExpertsShape(
            op="moe_experts", tokens=16, heads=1, experts=4, top_k=2, hidden=8, intermediate=16, dtype="float32"
        ),
        ExpertsShape(
            op="moe_experts", tokens=64, heads=1, experts=4, top_k=2, hidden=8, intermediate=16, dtype="float32"
        ),
    ]
    runs = []
    for name in ("one.json", "two.json"):
        timer = FakeTimer(toy_cost)
        runs.append(tune(points, device="cpu", reps=3, warmup=1, out=tmp_path / name, timer=timer, key=CPU))
        assert not any("provider reference" in label for label in timer.labels)  # the reference is never timed
    one, two = (r.profile for r in runs)
    assert one.preferences == two.preferences and one.plans == two.plans
    assert one.provenance.kind == "tune" and one.device.name == "toy cpu"
    norm = [r for r in one.preferences if r.op == "rmsnorm"]
    assert [r.prefer[0] for r in norm] == ["toy_a", "toy_b"]
    assert [str(c) for c in norm[0].when if c.field == "tokens"] == [f"tokens <= {cut(64, 512)}"]
    assert [r.plan["variant"] for r in one.plans] == ["narrow", "wide"]
    assert not partial_path(runs[0].path).exists()  # finished: the partial file is gone
    monkeypatch.setenv("MAGI2_PROFILE", str(runs[0].path))
    m2.reload_config()
    for tokens, want in ((8, "toy_a"), (100, "toy_a"), (181, "toy_a"), (182, "toy_b"), (4096, "toy_b")):
        res = m2.resolve("rmsnorm", torch.randn(tokens, 16), torch.zeros(1, 1, 16))
        assert (res.chosen, res.decided_by) == (want, "profile"), tokens


def test_a_stopped_run_resumes_where_it_stopped(tmp_path: Path) -> None:
    points = norm_points(8, 64, 512, 4096)
    out = tmp_path / "p.json"

    def dies_at_512(label: str) -> float:
        if label.startswith("rmsnorm 512x16"):
            raise KeyboardInterrupt
        return toy_cost(label)

    with pytest.raises(KeyboardInterrupt):
        tune(points, device="cpu", reps=2, warmup=0, out=out, timer=FakeTimer(dies_at_512), key=CPU)
    saved = json.loads(partial_path(out).read_text())
    assert [p["id"] for p in saved["points"]] == [p.id for p in points[:2]] and not out.exists()
    timer = FakeTimer(toy_cost)
    run = tune(points, device="cpu", reps=2, warmup=0, out=out, timer=timer, key=CPU)
    assert (run.measured, run.resumed) == (2, 2) and "resuming" in run.note
    assert {label.split("/")[0] for label in timer.labels} == {p.id for p in points[2:]}
    assert load_profile(out) == run.profile
    # --fresh: everything again; a partial file of another device: ignored, with a note
    timer = FakeTimer(toy_cost)
    tune(points, device="cpu", reps=2, warmup=0, out=out, fresh=True, timer=timer, key=CPU)
    assert {label.split("/")[0] for label in timer.labels} == {p.id for p in points}
    partial_path(out).write_text(
        json.dumps(
            {
                "format": "magi2-tune-partial",
                "device": {"type": "cpu", "name": "other", "capability": None},
                "points": [],
            }
        )
    )
    assert (
        "not on this"
        in tune(points[:1], device="cpu", reps=1, warmup=0, out=out, timer=FakeTimer(toy_cost), key=CPU).note
    )


def test_the_previous_profiles_rows_follow_the_measured_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old = tune(
        norm_points(8),
        device="cpu",
        reps=1,
        warmup=0,
        out=tmp_path / "old.json",
        timer=FakeTimer(lambda label: 1.0 if "toy_b" in label else 2.0),
        key=CPU,
    )
    assert old.profile.preferences[0].prefer[0] == "toy_b"
    monkeypatch.setenv("MAGI2_PROFILE", str(old.path))
    m2.reload_config()
    new = tune(
        norm_points(8, 512),
        device="cpu",
        reps=1,
        warmup=0,
        out=tmp_path / "new.json",
        timer=FakeTimer(toy_cost),
        key=CPU,
    )
    # the old tune's rows for rmsnorm are replaced, not kept behind the new ones
    assert [r.id for r in new.profile.preferences] == ["tune-rmsnorm-1", "tune-rmsnorm-2"]
    moe = tune(
        [
            ExpertsShape(
                op="moe_experts", tokens=16, heads=1, experts=4, top_k=2, hidden=8, intermediate=16, dtype="float32"
            )
        ],
        device="cpu",
        reps=1,
        warmup=0,
        out=tmp_path / "moe.json",
        timer=FakeTimer(toy_cost),
        key=CPU,
    )
    assert [r.op for r in moe.profile.preferences] == ["rmsnorm"]  # another op's tuned rows stay
    assert "old" not in moe.profile.provenance.note and "rows after the measured ones" in moe.profile.provenance.note


def _cli(args: list[str]) -> Any:
    return CliRunner().invoke(app, args)


def test_cli_tune_on_the_cpu_with_a_fake_timer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({"points": [p.model_dump() for p in norm_points(8, 512)]}))
    monkeypatch.setattr(timing, "default_timer", lambda device: FakeTimer(toy_cost))
    out = tmp_path / "mine.json"
    result = _cli(["tune", "--device", "cpu", "--shapes", str(shapes), "--out", str(out), "--reps", "2"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "wrote profile tuned-cpu to" in text and f"MAGI2_PROFILE={out.resolve()}" in text
    assert [r.prefer[0] for r in load_profile(out).preferences] == ["toy_a", "toy_b"]
    result = _cli(["tune", "--device", "cpu", "--shapes", str(shapes), "--out", str(out), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["points"] == 2
    monkeypatch.setenv("MAGI2_PROFILE", str(out))
    m2.reload_config()
    shown = _cli(["tune", "--show", "--device", "cpu"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "active profile for cpu" in text and "tuned-cpu (env;" in text and "provenance: tune:" in text
    assert "tune-rmsnorm-1: rmsnorm where" in text and "prefer toy_a" in text
    data = json.loads(_cli(["tune", "--show", "--device", "cpu", "--json"]).output)
    assert data["source"] == "env" and data["profile"]["name"] == "tuned-cpu"


def test_cli_show_on_a_device_without_measurements_names_tune() -> None:
    shown = _cli(["tune", "--show", "--device", "cpu"])
    assert shown.exit_code == 0 and "no measurements of this device" in shown.output and "magi2 tune" in shown.output
    # the plan rows a provider reads here, from the core's profiles (the Triton backend ships them)
    text = " ".join(shown.output.split())
    assert "moe_experts on triton: generic rows generic-cpu (magi2_backend_triton/profiles/generic-cpu.json)" in text
    assert "row 1 where every call -> variant=one_kernel" in text
    plans = json.loads(_cli(["tune", "--show", "--device", "cpu", "--json"]).output)["plans"]
    assert [(p["op"], p["provider"], len(p["rows"])) for p in plans] == [("moe_experts", "triton", 2)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ops", "convolution"], "--ops 'convolution'"),
        (["--reps", "0"], "--reps must be at least 1"),
        (["--device", "tpu"], "expected cuda, cuda:N, musa or cpu"),
        (["--device", "cpu", "--shapes", "/nonexistent/shapes.json"], "readable JSON file"),
        (["--device", "cpu", "--ops", "attention", "--shapes", "SHAPES"], "no point of --shapes"),
    ],
    ids=["ops", "reps", "device", "shapes", "no-points"],
)
def test_cli_tune_refuses_what_it_cannot_do(args: list[str], message: str, tmp_path: Path) -> None:
    shapes = tmp_path / "s.json"
    shapes.write_text(json.dumps([p.model_dump() for p in norm_points(8)]))
    result = _cli(["tune", *[str(shapes) if a == "SHAPES" else a for a in args]])
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


def test_cli_tune_on_a_machine_without_musa_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import magi2_core.model.devices

    monkeypatch.setattr(magi2_core.model.devices, "musa_available", lambda: False)
    result = _cli(["tune", "--device", "musa"])
    assert result.exit_code == 2 and "no usable MUSA device" in " ".join(result.output.split()), result.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cli_tune_without_a_gpu_says_so() -> None:
    result = _cli(["tune"])
    assert result.exit_code == 2 and "sees no CUDA device" in result.output and "--device cpu" in result.output


def test_profile_check_times_the_resolved_call_and_never_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.profile_check import check_point, run

    def cost(label: str) -> float:
        name = label.partition("/")[2]
        return {"resolved": 1.02, "provider toy_a": 1.0, "plan toy_planned#0": 1.5, "plan toy_planned#1": 1.0}.get(
            name, 5.0
        )

    timer = FakeTimer(cost)
    (norm,) = norm_points(8)
    row = check_point(norm, device="cpu", reps=2, warmup=0, bar=1.03, timer=timer)
    # the choice is judged (toy_a forced is the fastest forced provider); the resolved call is reported beside it
    assert row["ok"] and row["resolved"] == "toy_a" and row["choice_ratio"] == pytest.approx(1.0)
    assert row["call_ratio"] == pytest.approx(1.02) and row["call_overhead_ms"] == pytest.approx(0.02)
    assert row["fastest_provider"] == "toy_a" and "reference" in row["eligible"]
    moe = ExpertsShape(
        op="moe_experts", tokens=16, heads=1, experts=4, top_k=2, hidden=8, intermediate=16, dtype="float32"
    )
    row = check_point(moe, device="cpu", reps=2, warmup=0, bar=1.03, timer=timer)
    assert not row["ok"] and row["plan_ratio"] == pytest.approx(1.5) and row["fastest_plan"].startswith("wide")
    assert not any("reference" in label for label in timer.labels)
    # a call that resolves to the reference while a toy could serve it fails, and is not timed
    monkeypatch.setenv("MAGI2_RMSNORM_PROVIDER", "reference")
    m2.reload_config()
    timer = FakeTimer(cost)
    result = run([norm], device="cpu", reps=2, warmup=0, bar=1.03, plans=True, timer=timer)
    (row,) = result["points"]
    assert not row["ok"] and "fell to the reference" in row["why"] and timer.labels == []
    assert result["summary"]["fell_to_reference"] == [norm.id] and result["profile"]["source"] == "generic"


def test_a_provider_that_raises_is_reported_not_timed(toys: types.ModuleType) -> None:
    def broken(call: RMSNormCall) -> torch.Tensor:
        raise RuntimeError("no kernel for this shape")

    toys.norm = broken  # both toys fail: nothing left to time at the point, the run goes on
    timer = FakeTimer(toy_cost)
    run = tune(norm_points(8), device="cpu", reps=1, warmup=0, out=None, timer=timer, key=CPU)
    (result,) = run.results
    assert set(result.errors) >= {"provider toy_a", "provider toy_b"} and "no kernel" in result.errors["provider toy_a"]
    assert "toy_a" not in result.providers and not any("toy_" in label for label in timer.labels)
