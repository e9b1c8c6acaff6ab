"""The shipped Hopper profiles are what their scripts make of the committed measurements, and the generic rule.

``scripts/ship_tuned_profile.py`` writes the H100's two fragments from its tune;
``scripts/generic_hopper_rows.py`` keeps the H200's MoE rows that are within 1.25x of the fastest on
both the H200 and the H100. A hand edit of either fragment, or new results, makes these fail until
the script is run again.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from magi2_core.model.problem import Problem

ROOT = Path(__file__).resolve().parent.parent


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows() -> ModuleType:
    return _script("generic_hopper_rows")


def test_the_generic_hopper_rows_are_the_rule_applied_to_the_committed_checks(rows: ModuleType) -> None:
    assert rows.main(["--check"]) == 0, "run python scripts/generic_hopper_rows.py"
    doc = json.loads(rows.OUT.read_text())
    assert "NVIDIA H200 and the NVIDIA H100 80GB HBM3" in doc["provenance"]["note"]
    for files in rows.DEVICES.values():
        assert all((rows.RESULTS / f).is_file() for f in files)


def test_the_h100_profile_is_its_tune_split_as_shipped_profiles_are() -> None:
    ship = _script("ship_tuned_profile")
    assert ship.main(["--check"]) == 0, "run python scripts/ship_tuned_profile.py"
    tune = json.loads((ROOT / ship.H100.tune).read_text())
    core = json.loads((ROOT / "magi2_core" / "profiles" / "nvidia-h100.json").read_text())
    assert core["device"] == tune["device"] == {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}
    assert [p["when"] for p in core["preferences"]] == [p["when"] for p in tune["preferences"]]
    assert all("measured here" not in p["why"] for p in core["preferences"])


# ---- the rule, on made-up timings -----------------------------------------------------------------
def _row(variant: str, tile: dict[str, int], align: str = "device", **when: int) -> dict[str, Any]:
    return {
        "op": "moe_experts",
        "provider": "triton",
        "plan": {"variant": variant, "tile": tile, "align": align},
        "when": [{"field": f, "op": "le", "value": v} for f, v in when.items()],
        "why": "w",
    }


G = {"BLOCK_M": 64, "BLOCK_I": 32, "num_warps": 4, "num_stages": 3}
P = {"BLOCK_M": 16, "BLOCK_I": 32, "num_warps": 4, "num_stages": 4}
T = {
    "BLOCK_M": 16,
    "BLOCK_N1": 32,
    "BLOCK_K1": 64,
    "GROUP_M1": 8,
    "num_warps1": 4,
    "num_stages1": 4,
    "BLOCK_N2": 64,
    "BLOCK_K2": 64,
    "GROUP_M2": 8,
    "num_warps2": 4,
    "num_stages2": 4,
}


def _point(rows: ModuleType, tokens: int, ms: dict[str, float]) -> Any:
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
    )  # 768 flat experts: stable kernels
    tiles = {"gluon": G, "one_kernel": P, "two_kernel": T}
    timed = {(v, frozenset(tiles[v].items()), "stable_kernels"): x for v, x in ms.items()}
    return rows.Point(str(tokens), rows.with_routes_per_expert(problem), timed)


def test_a_row_is_judged_against_what_can_run_where_it_is_reached(rows: ModuleType) -> None:
    candidates = {
        "plans": [
            _row("gluon", G, routes_per_expert=16),
            _row("one_kernel", P, routes_per_expert=16),
            _row("two_kernel", T, routes_per_expert=16),
            _row("gluon", G, routes_per_expert=64),
            _row("two_kernel", T),
        ]
    }
    fast = {"gluon": 1.0, "one_kernel": 1.2, "two_kernel": 1.5}  # two_kernel: 1.5x of all, 1x of its own
    slow = {"gluon": 1.3, "one_kernel": 1.0, "two_kernel": 1.1}  # gluon 1.3x the `one_kernel` variant
    verdicts = [v for _, v in rows.judged(candidates, {"a": [_point(rows, 512, fast)], "b": [_point(rows, 512, fast)]})]
    assert verdicts[:3] == [
        "kept: worst a 1.000x / b 1.000x",
        "kept: worst a 1.000x / b 1.000x",
        "kept: worst a 1.000x / b 1.000x",
    ]
    assert verdicts[3:] == ["unmeasured", "unmeasured"]  # 12 routes per expert: the first region takes the point
    verdicts = [v for _, v in rows.judged(candidates, {"a": [_point(rows, 512, fast)], "b": [_point(rows, 512, slow)]})]
    assert verdicts[0] == "dropped: slower than 1.25x the fastest on b 1.300x"
    assert verdicts[1] == "kept: worst a 1.000x / b 1.000x"
    verdicts = [v for _, v in rows.judged(candidates, {"a": [_point(rows, 4096, fast)], "b": []})]
    assert verdicts == ["unmeasured", "unmeasured", "unmeasured", "unmeasured", "unmeasured (reached on a 1.000x only)"]
