"""Short attention on a (fake) H200: the profile's speed preferences never send a call FA3 can serve to
the reference. Before device profiles, FA3's short-work rules vetoed FA3 itself, so deterministic or
GQA short work (which torch varlen cannot serve) fell to the eager reference."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from magi2_backend_cuda_fa3 import plugin as fa3_plugin
from magi2_backend_cuda_fa3.discovery import FoundBuild
from magi2_backend_reference.plugin import PROVIDERS as REFERENCE_PROVIDERS

import magi2_core as m2
from magi2_core.model import devices
from magi2_core.model.problem import Feature, Problem
from magi2_core.profiles import reset_profiles
from magi2_core.reasons import Resolution
from magi2_core.selection.registry import Registry
from magi2_core.selection.resolver import resolve_problem
from magi2_core.testing import InProcessBackend

HOST = "fake_fa3_profile_host"


class _Runs:
    """A kernel object whose run-time check passes, as on a real Hopper with an FA3 build."""

    def check(self, problem: Problem) -> list[Any]:
        return []


@pytest.fixture(autouse=True)
def _h200(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no user profile of this machine
    monkeypatch.setattr(
        devices, "device_identity", lambda kind, index=None: ("NVIDIA H200", "9.0") if kind == "cuda" else (None, None)
    )
    host = types.ModuleType(HOST)
    host.runs = _Runs()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, HOST, host)
    reset_profiles()
    yield
    reset_profiles()


def _world(*, varlen_gqa: bool) -> Registry:
    """Torch varlen (with or without GQA, as torch 2.13 / 2.11), FA3 and the eager reference (a copy:
    the name ``reference`` is reserved to the genuine backend), each runnable on CUDA."""
    varlen = next(c for c in REFERENCE_PROVIDERS if c.name == "torch_varlen")
    feats = varlen.features | {Feature.GQA} if varlen_gqa else varlen.features - {Feature.GQA}
    build = FoundBuild("fa3-fwd", ("fa3_fwd_interface",), "fa3_fwd", "fa3-fwd", "0.0.3")
    reference = next(c for c in REFERENCE_PROVIDERS if c.op == "attention" and c.name == "reference")
    caps = (
        varlen.model_copy(update={"impl": f"{HOST}:runs", "features": feats}),
        fa3_plugin.descriptor(build).model_copy(update={"impl": f"{HOST}:runs"}),
        reference.model_copy(update={"name": "eager"}),
    )
    reg = Registry(discover=False)
    reg.register(
        InProcessBackend(m2.BackendSpec(name="world", version="0", core_api=">=2.0,<3", providers=caps)), name="world"
    )
    return reg


def _short(*features: Feature, heads_kv: int = 24) -> Problem:
    # 512 tokens in 256-token segments, 24 heads, bf16: the measured call
    return Problem(
        op="attention",
        device_type="cuda",
        dtype="bfloat16",
        features=frozenset(features),
        tokens=512,
        tokens_k=512,
        max_seqlen_q=256,
        max_seqlen_k=256,
        num_segments=2,
        head_dim=128,
        num_heads_q=24,
        num_heads_kv=heads_kv,
    )


def _resolve(reg: Registry, problem: Problem) -> Resolution:
    return resolve_problem(problem, registry=reg)


def test_deterministic_short_work_goes_to_fa3_not_the_reference() -> None:
    res = _resolve(_world(varlen_gqa=False), _short(Feature.DETERMINISTIC))
    assert res.chosen == "fa3", res.explain()
    # the profile's row matched and prefers torch varlen, which cannot serve a deterministic call
    assert res.preference is not None and res.preference.id == "h200-short-work-2048x1024"
    assert res.decided_by == "priority" and "none of the providers it prefers is eligible" in res.explain()
    assert res.profile is not None and (res.profile.name, res.profile.source) == ("nvidia-h200", "shipped")


def test_gqa_short_work_without_varlen_gqa_goes_to_fa3() -> None:
    gqa = _short(Feature.GQA, heads_kv=8)
    assert _resolve(_world(varlen_gqa=False), gqa).chosen == "fa3"
    res = _resolve(_world(varlen_gqa=True), gqa)  # a torch whose varlen_attn takes enable_gqa
    assert (res.chosen, res.decided_by) == ("torch_varlen", "profile"), res.explain()


def test_plain_short_work_still_prefers_torch_varlen_and_long_work_fa3() -> None:
    reg = _world(varlen_gqa=False)
    res = _resolve(reg, _short())
    assert (res.chosen, res.decided_by) == ("torch_varlen", "profile"), res.explain()
    assert "torch varlen_attn beats FA3" in res.explain()
    long = _short().model_copy(
        update={"tokens": 32768, "tokens_k": 32768, "max_seqlen_q": 32768, "max_seqlen_k": 32768, "num_segments": 1}
    )
    res = _resolve(reg, long)
    assert (res.chosen, res.decided_by, res.preference) == ("fa3", "priority", None)
    assert _resolve(reg, _short(Feature.SINKS)).chosen == "fa3"  # no fa4 here: FA3 + the correction


def test_generic_profile_never_falls_to_the_reference_either(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGI2_PROFILE", "generic")
    m2.reload_config()
    reg = _world(varlen_gqa=False)
    for problem in (_short(), _short(Feature.DETERMINISTIC), _short(Feature.GQA, heads_kv=8), _short(Feature.SINKS)):
        res = _resolve(reg, problem)
        assert res.chosen == "fa3" and res.profile is not None and res.profile.source == "generic", res.explain()
