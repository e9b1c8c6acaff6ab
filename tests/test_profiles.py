"""Device profiles: the file format, which profile is active, merging, precedence and cache buckets."""

from __future__ import annotations

import copy
import json
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import magi2_core as m2
from magi2_core import BackendSpec, Capability, Problem
from magi2_core.errors import ConfigError, ProfileError
from magi2_core.model import devices
from magi2_core.ops.rmsnorm import SPEC as RMSNORM_SPEC
from magi2_core.ops.rmsnorm import RMSNormCall, RMSNormKey
from magi2_core.profiles import (
    LoadedProfile,
    active_profile,
    load_profile,
    profile_for,
    reset_profiles,
    shipped_profiles,
    user_profile_dir,
)
from magi2_core.selection.dispatch import Dispatcher
from magi2_core.selection.registry import Registry
from magi2_core.selection.resolver import resolve_problem
from magi2_core.testing import InProcessBackend

ROOT = Path(__file__).resolve().parent.parent
TOY = "magi2_profile_toys"
H200 = ("NVIDIA H200", "9.0")


class Tagged:
    """An rmsnorm kernel that fills its output with a tag, so a test can see who ran."""

    def __init__(self, tag: float) -> None:
        self.tag = tag

    def __call__(self, call: RMSNormCall) -> torch.Tensor:
        return torch.full(call.x.shape, self.tag, dtype=call.out_dtype)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No user profile of this machine, toy kernels importable, every profile cache fresh."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    mod = types.ModuleType(TOY)
    mod.low = Tagged(1.0)  # type: ignore[attr-defined]
    mod.high = Tagged(2.0)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, TOY, mod)
    reset_profiles()
    yield
    reset_profiles()


def _device(monkeypatch: pytest.MonkeyPatch, name: str | None, capability: str | None, kind: str = "cuda") -> None:
    monkeypatch.setattr(
        devices, "device_identity", lambda t, index=None: (name, capability) if t == kind else (None, None)
    )
    reset_profiles()


def _doc(name: str = "toy", device: dict[str, Any] | None = None, **rows: Any) -> dict[str, Any]:
    return {
        "format": "magi2-profile",
        "version": 1,
        "name": name,
        "device": device or {"type": "cpu"},
        "provenance": {"kind": "tune", "source": "test", "date": "2026-12-24", "tool": "magi2 tune"},
        **rows,
    }


def _pref(
    prefer: list[str], op: str = "rmsnorm", when: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    return {"op": op, "when": when or [], "prefer": prefer, "why": f"{(prefer or ['?'])[0]} measured faster", **extra}


def _write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _norm(name: str, attr: str, priority: int) -> Capability:
    return Capability(
        op="rmsnorm", name=name, impl=f"{TOY}:{attr}", device_types=("cpu",), dtypes=("float32",), priority=priority
    )


def _attention_problem(**extra: Any) -> Problem:
    fields: dict[str, Any] = dict(
        tokens=512,
        tokens_k=512,
        max_seqlen_q=256,
        max_seqlen_k=256,
        num_segments=2,
        head_dim=128,
        num_heads_q=24,
        num_heads_kv=24,
    )
    fields.update(extra)
    return Problem(op="attention", device_type="cuda", dtype="bfloat16", **fields)


# ---------------------------------------------------------------------------------------------
# the file format
# ---------------------------------------------------------------------------------------------
def test_every_shipped_profile_is_valid_and_names_files_that_exist() -> None:
    shipped = {f.profile.name: f for f in shipped_profiles()}
    h200 = shipped["nvidia-h200"].profile
    assert (h200.device.type, h200.device.name, h200.device.capability) == ("cuda", "NVIDIA H200", "9.0")
    assert h200.libraries["torch"] == "2.11" and h200.preferences
    for frag in shipped.values():
        rows = (*frag.profile.preferences, *frag.profile.plans)
        for prov in (frag.profile.provenance, *(r.provenance for r in rows if r.provenance)):
            if prov.kind == "benchmark":
                assert (ROOT / prov.source).is_file(), prov
    h100 = shipped["nvidia-h100"].profile
    assert (h100.device.type, h100.device.name, h100.device.capability) == ("cuda", "NVIDIA H100 80GB HBM3", "9.0")
    assert (h100.provenance.kind, h100.provenance.date) == ("tune", "2026-12-06") and h100.preferences
    assert (ROOT / h100.provenance.source).is_file() and "commit e6abbd8" in h100.provenance.note
    for profile in (h200, h100):
        ids = [r.id for r in profile.preferences]
        assert len(set(ids)) == len(ids) and all(ids)


def test_profile_methods(tmp_path: Path) -> None:
    doc = _doc(
        preferences=[_pref(["a"], when=[{"field": "tokens", "op": "le", "value": 64}]), _pref(["b"])],
        plans=[
            {
                "op": "moe_experts",
                "provider": "triton",
                "when": [{"field": "tokens", "op": "gt", "value": 8}],
                "plan": {"variant": "gluon", "tile": {"BLOCK_M": 64}},
                "why": "measured",
            },
            {"op": "moe_experts", "provider": "triton", "plan": {"variant": "one"}, "why": "the rest"},
        ],
    )
    profile = load_profile(_write(tmp_path / "p.json", doc))
    small = Problem(op="rmsnorm", device_type="cpu", dtype="float32", tokens=64)
    large = small.model_copy(update={"tokens": 65})
    pref = profile.preference_for(small)
    assert pref is not None and pref.prefer == ("a",)
    pref = profile.preference_for(large)
    assert pref is not None and pref.prefer == ("b",)  # rows in file order: the first match wins
    moe = Problem(op="moe_experts", device_type="cpu", dtype="bfloat16", tokens=9)
    row = profile.plan_for("moe_experts", "triton", moe)
    assert row is not None and row.plan["variant"] == "gluon"
    row = profile.plan_for("moe_experts", "triton", moe.model_copy(update={"tokens": 8}))
    assert row is not None and row.plan["variant"] == "one"
    assert len(profile.plans_for("moe_experts", "triton")) == 2 and profile.plans_for("moe_experts", "other") == ()
    assert profile.boundaries() == {"rmsnorm": {"tokens": {64, 65}}, "moe_experts": {"tokens": {8, 9}}}
    with pytest.raises(ValueError, match="frozen"):
        profile.name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": 2}, "version"),
        ({"format": "other"}, "format"),
        ({"preferences": [{"op": "rmsnorm", "prefer": ["a"]}]}, "preferences.0.why"),
        ({"preferences": [_pref([])]}, "preferences.0.prefer"),
        (
            {"preferences": [_pref(["a"], when=[{"field": "tokens", "op": "le", "value": "2048"}])]},
            "preferences.0.when.0",
        ),
        ({"preferences": [_pref(["a"], when=[{"field": "head_dim", "op": "le", "value": 64}])]}, "preferences[0].when"),
        ({"device": {"type": "cuda", "capability": "nine"}}, "device.capability"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_a_bad_file_names_the_file_and_the_field(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    path = _write(tmp_path / "bad.json", {**_doc(), **change})
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert str(path) in str(info.value) and field in str(info.value), info.value


def test_not_json_or_missing(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(ProfileError, match="not JSON"):
        load_profile(tmp_path / "x.json")
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "absent.json")


# ---------------------------------------------------------------------------------------------
# which profile is active
# ---------------------------------------------------------------------------------------------
def test_the_h200_gets_the_shipped_profile_and_an_unknown_device_the_generic_one(monkeypatch) -> None:
    _device(monkeypatch, *H200)
    loaded = active_profile("cuda:0", backends=())
    assert (loaded.name, loaded.source, loaded.origins) == (
        "nvidia-h200",
        "shipped",
        ("magi2_core/profiles/nvidia-h200.json",),
    )
    assert any("measured with torch 2.11" in note for note in loaded.note.libraries)  # CI runs another torch
    _device(monkeypatch, "NVIDIA H20", "9.0")  # same capability, another device: not the H200's table
    loaded = active_profile("cuda", backends=())
    assert (loaded.name, loaded.source, loaded.generic) == ("generic-cuda-9.0", "generic", True)
    assert loaded.profile.preferences == ()
    assert active_profile("cpu", backends=()).name == "generic-cpu"


def test_loaded_once_per_device(monkeypatch) -> None:
    seen: list[tuple[str, int | None]] = []

    def probe(kind: str, index: int | None = None) -> tuple[str | None, str | None]:
        seen.append((kind, index))
        return H200

    monkeypatch.setattr(devices, "device_identity", probe)
    reset_profiles()
    first = active_profile("cuda:0", backends=())
    assert active_profile("cuda:0", backends=()) is first and seen == [("cuda", 0)]
    active_profile("cuda:1", backends=())
    assert seen == [("cuda", 0), ("cuda", 1)]


def test_the_generic_profile_explains_itself_and_names_tune(monkeypatch) -> None:
    _device(monkeypatch, "NVIDIA H20", "9.0")
    res = resolve_problem(_attention_problem())
    assert res.profile is not None and res.profile.source == "generic" and res.preference is None
    text = res.explain()
    assert "profile: generic-cuda-9.0" in text and "NVIDIA H20 (capability 9.0)" in text
    assert "magi2 tune" in text and "no preference of the profile matched" in text
    dumped = res.model_dump(mode="json")
    assert dumped["profile"]["source"] == "generic" and dumped["decided_by"] == "priority"


def test_user_profile_wins_over_the_shipped_one_for_its_device(tmp_path: Path, monkeypatch, caplog) -> None:
    _device(monkeypatch, *H200)
    folder = user_profile_dir()
    assert folder == tmp_path / "cache" / "magi2" / "profiles"
    h200 = {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0"}
    _write(folder / "a-old.json", _doc("old", h200, libraries={"torch": "1.0"}))
    _write(folder / "b-mine.json", _doc("mine", h200, libraries={"torch": str(torch.__version__)[:4]}))
    _write(folder / "c-other.json", _doc("other", {"type": "cuda", "name": "NVIDIA H20", "capability": "9.0"}))
    (folder / "d-broken.json").write_text("{")
    reset_profiles()
    with caplog.at_level(logging.WARNING, logger="magi2_core"):
        loaded = active_profile("cuda", backends=())
    # the one measured with the installed torch first, although another sorts before it
    assert (loaded.name, loaded.source) == ("mine", "user") and loaded.origins == (str(folder / "b-mine.json"),)
    assert "d-broken.json" in caplog.text and "not JSON" in caplog.text
    (folder / "b-mine.json").unlink()
    reset_profiles()
    loaded = active_profile("cuda", backends=())
    assert loaded.name == "old" and "measured with torch 1.0" in loaded.note.libraries[0]


def test_magi2_profile_variants(tmp_path: Path, monkeypatch) -> None:
    _device(monkeypatch, *H200)
    monkeypatch.setenv("MAGI2_PROFILE", "generic")
    m2.reload_config()
    assert active_profile("cuda", backends=()).source == "generic"
    path = _write(tmp_path / "mine.json", _doc("from-file", {"type": "cuda"}, preferences=[_pref(["x"], "attention")]))
    monkeypatch.setenv("MAGI2_PROFILE", str(path))
    m2.reload_config()
    loaded = active_profile("cuda", backends=())
    assert (loaded.name, loaded.source, loaded.origins) == ("from-file", "env", (str(path),))
    assert active_profile("cpu", backends=()).source == "generic"  # a cuda profile: not for the CPU
    _device(monkeypatch, None, None)  # by name, on a device that has no profile of its own
    monkeypatch.setenv("MAGI2_PROFILE", "nvidia-h200")
    m2.reload_config()
    loaded = active_profile("cuda", backends=())
    assert (loaded.name, loaded.source) == ("nvidia-h200", "env")
    monkeypatch.setenv("MAGI2_PROFILE", "nvidia-h999")
    m2.reload_config()
    with pytest.raises(ConfigError, match=r"MAGI2_PROFILE.*nvidia-h999.*shipped: generic, nvidia-h100, nvidia-h200"):
        active_profile("cuda", backends=())


def test_magi2_profile_bad_file_is_a_config_error_naming_file_and_field(tmp_path: Path, monkeypatch) -> None:
    path = _write(tmp_path / "bad.json", {**_doc(), "preferences": [{"op": "rmsnorm", "why": "w"}]})
    monkeypatch.setenv("MAGI2_PROFILE", str(path))
    with pytest.raises(ConfigError) as info:
        m2.reload_config()
    assert "MAGI2_PROFILE" in str(info.value) and str(path) in str(info.value)
    assert "preferences.0.prefer" in str(info.value)
    monkeypatch.setenv("MAGI2_PROFILE", "not a name!")
    with pytest.raises(ConfigError, match="neither a profile name nor a path"):
        m2.reload_config()


# ---------------------------------------------------------------------------------------------
# resolution: precedence, the deciding row, cache buckets
# ---------------------------------------------------------------------------------------------
def _tag(**kw: Any) -> float:
    return float(m2.rmsnorm(torch.randn(2, 4), torch.zeros(1, 1, 4), **kw)[0, 0])


def test_precedence_call_use_env_profile_priority(tmp_path: Path, monkeypatch) -> None:
    spec = BackendSpec(
        name="toys",
        version="0",
        core_api=">=2.0,<3",
        providers=(_norm("toy_high", "high", 50), _norm("toy_low", "low", -50)),
    )
    reg = m2.get_registry()
    reg.register(InProcessBackend(spec), name="toys")
    try:
        assert _tag() == 2.0  # priority
        path = _write(tmp_path / "cpu.json", _doc(preferences=[_pref(["toy_low"])]))
        monkeypatch.setenv("MAGI2_PROFILE", str(path))
        m2.reload_config()
        assert _tag() == 1.0  # the profile beats priority
        res = m2.resolve("rmsnorm", torch.randn(2, 4), torch.zeros(1, 1, 4))
        assert (res.decided_by, res.chosen) == ("profile", "toy_low")
        assert res.preference is not None and res.preference.why == "toy_low measured faster"
        assert "tune: test, 2026-12-24, by magi2 tune" in res.explain()
        monkeypatch.setenv("MAGI2_RMSNORM_PROVIDER", "reference")
        m2.reload_config()
        assert m2.resolve("rmsnorm", torch.randn(2, 4), torch.zeros(1, 1, 4)).chosen == "reference"  # env > profile
        with m2.use(rmsnorm="toy_high"):
            assert _tag() == 2.0  # use() > env
            assert _tag(provider="toy_low") == 1.0  # call > use()
    finally:
        reg.unregister("toys")


def test_a_preferred_provider_that_cannot_serve_gives_way_to_the_next_eligible(tmp_path: Path, monkeypatch) -> None:
    spec = BackendSpec(
        name="toys",
        version="0",
        core_api=">=2.0,<3",
        providers=(_norm("toy_high", "high", 50), _norm("toy_low", "low", -50)),
    )
    reg = _with_reference(Registry(discover=False))
    reg.register(InProcessBackend(spec), name="toys")
    path = _write(tmp_path / "cpu.json", _doc(preferences=[_pref(["toy_low", "toy_high"])]))
    monkeypatch.setenv("MAGI2_PROFILE", str(path))
    m2.reload_config()
    p = Problem(op="rmsnorm", device_type="cpu", dtype="float32", tokens=4, width=4, num_modalities=1, num_patterns=1)
    res = resolve_problem(p, registry=reg)
    # the listed ones first, in listed order, then the others by priority
    order = [c.provider for c in res.candidates]
    assert order[:2] == ["toy_low", "toy_high"] and order[-1] == "reference" and res.chosen == "toy_low"
    # a float16 call: neither toy serves it, so the reference does, although the profile lists them
    half = resolve_problem(p.model_copy(update={"dtype": "float16"}), registry=reg)
    assert half.chosen == "reference" and half.decided_by == "priority" and half.preference is not None
    assert "none of the providers it prefers is eligible" in half.explain()


def _with_reference(reg: Registry) -> Registry:
    import magi2_backend_reference.plugin as ref_plugin

    reg.register(ref_plugin, name="reference")
    return reg


def test_dispatcher_buckets_on_profile_boundaries(tmp_path: Path, monkeypatch) -> None:
    spec = BackendSpec(
        name="toys",
        version="0",
        core_api=">=2.0,<3",
        providers=(_norm("toy_high", "high", 50), _norm("toy_low", "low", -50)),
    )
    reg = Registry(discover=False)
    reg.register(InProcessBackend(spec), name="toys")
    when = [{"field": "tokens", "op": "le", "value": 2048}]
    path = _write(tmp_path / "cpu.json", _doc(preferences=[_pref(["toy_low"], when=when)]))
    monkeypatch.setenv("MAGI2_PROFILE", str(path))
    m2.reload_config()
    disp = Dispatcher(reg)
    builds: list[int] = []

    def problem(key: RMSNormKey) -> Problem:
        builds.append(key.tokens)
        return RMSNORM_SPEC.problem(key)

    rec = copy.copy(RMSNORM_SPEC)  # the op's spec, its problems recorded
    rec.problem = problem  # type: ignore[method-assign]

    def kernel(tokens: int) -> object:
        return disp.kernel(rec, RMSNormKey("cpu", "float32", "float32", 0, tokens, 128, 1, 1), None).kernel

    toys = sys.modules[TOY]
    assert kernel(100) is toys.low and kernel(1000) is toys.low  # type: ignore[attr-defined]
    assert kernel(2049) is toys.high and kernel(9000) is toys.high  # type: ignore[attr-defined]
    assert builds == [100, 2049]  # one resolution per bucket of the profile's boundaries
    assert kernel(2048) is toys.low and builds == [100, 2049, 2048]  # a condition's own value: its own bucket


# ---------------------------------------------------------------------------------------------
# backends' fragments
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def fragments_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An importable package holding profile fragments as package data."""
    pkg = tmp_path / "pkgs" / "magi2_test_fragments"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    h200 = {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0"}
    own = {"kind": "benchmark", "source": "their-lab/h200.json"}
    _write(
        pkg / "alpha.json",
        _doc(
            "alpha-h200",
            h200,
            preferences=[_pref(["alpha_attn"], "attention", id="alpha-1")],
            plans=[{"op": "moe_experts", "provider": "alpha", "plan": {"v": 1}, "why": "w"}],
        ),
    )
    _write(pkg / "zeta.json", _doc("zeta-h200", h200, preferences=[_pref(["zeta_attn"], "attention", provenance=own)]))
    _write(
        pkg / "generic.json", _doc("zeta-generic", {"type": "cuda"}, preferences=[_pref(["zeta_attn"], "attention")])
    )
    _write(pkg / "broken.json", {**_doc(), "version": 7})
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    return "magi2_test_fragments"


def _fragment_backend(name: str, *resources: str) -> InProcessBackend:
    return InProcessBackend(BackendSpec(name=name, version="0", core_api=">=2.0,<3", providers=(), profiles=resources))


def test_fragments_merge_core_first_then_backends_by_name(fragments_pkg: str, monkeypatch) -> None:
    _device(monkeypatch, *H200)
    reg = Registry(discover=False)
    reg.register(
        _fragment_backend("zeta-backend", f"{fragments_pkg}:zeta.json", f"{fragments_pkg}:generic.json"), name="zeta"
    )
    reg.register(_fragment_backend("alpha-backend", f"{fragments_pkg}:alpha.json"), name="alpha")
    assert reg.quarantined() == ()
    loaded: LoadedProfile = profile_for("cuda", None, reg.state().profiles)
    assert (loaded.name, loaded.source) == ("nvidia-h200", "shipped")
    core = [r.id for r in loaded.profile.preferences][:6]
    assert all(i.startswith("h200-") for i in core)
    tail = loaded.profile.preferences[6:]
    assert [r.prefer[0] for r in tail] == ["alpha_attn", "zeta_attn"]  # backend-name order, generic one not here
    assert tail[0].provenance is not None and tail[0].provenance.kind == "tune"  # the fragment's, filled in
    assert tail[1].provenance is not None and tail[1].provenance.source == "their-lab/h200.json"  # its own
    assert [r.provider for r in loaded.profile.plans] == ["alpha"]
    assert "alpha-backend" in loaded.note.origin and "zeta-backend" in loaded.note.origin
    _device(monkeypatch, "NVIDIA H20", "9.0")  # no shipped profile: the generic one, with the generic fragment
    loaded = profile_for("cuda", None, reg.state().profiles)
    assert loaded.source == "generic" and [r.prefer[0] for r in loaded.profile.preferences] == ["zeta_attn"]


def test_a_generic_fragment_may_name_the_major_capability_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "pkgs" / "magi2_test_sm9_fragments"
    _write(
        pkg / "sm9.json", _doc("sm9", {"type": "cuda", "capability": "9"}, preferences=[_pref(["nine"], "attention")])
    )
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    reg = Registry(discover=False)
    reg.register(_fragment_backend("nine-backend", "magi2_test_sm9_fragments:sm9.json"), name="nine")
    assert reg.quarantined() == ()
    for capability, rows in (("9.0", ["nine"]), ("9.1", ["nine"]), ("8.0", []), ("10.0", [])):
        _device(monkeypatch, "NVIDIA H20", capability)
        reset_profiles()
        loaded = profile_for("cuda", None, reg.state().profiles)
        assert loaded.source == "generic" and [r.prefer[0] for r in loaded.profile.preferences] == rows, capability
    with pytest.raises(ProfileError, match=r"major\.minor"):  # a named device's profile gives the whole capability
        load_profile(
            _write(tmp_path / "named.json", _doc("x", {"type": "cuda", "name": "NVIDIA H20", "capability": "9"}))
        )


def _plan_doc(name: str, device: dict[str, Any], *tags: str, provider: str = "toy") -> dict[str, Any]:
    return _doc(
        name,
        device,
        plans=[
            {
                "op": "moe_experts",
                "provider": provider,
                "plan": {"tag": t},
                "why": t,
                "when": [{"field": "tokens", "op": "le", "value": 100}] if t.endswith("<=100") else [],
            }
            for t in tags
        ],
    )


@pytest.fixture
def plan_fragments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """A backend's plan fragments: one naming the H200, a CUDA 9.x one, a CUDA-wide one, another provider's."""
    from magi2_core.profiles import fragment_from_resource

    pkg = tmp_path / "pkgs" / "magi2_test_plans"
    _write(
        pkg / "h200.json", _plan_doc("toy-h200", {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0"}, "h200")
    )
    _write(pkg / "sm9.json", _plan_doc("toy-sm9", {"type": "cuda", "capability": "9"}, "sm9"))
    _write(pkg / "cuda.json", _plan_doc("toy-cuda", {"type": "cuda"}, "cuda"))
    _write(
        pkg / "other.json",
        _plan_doc(
            "other-h100", {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}, "x", provider="other"
        ),
    )
    (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    return tuple(
        fragment_from_resource("toy-backend", f"magi2_test_plans:{f}.json") for f in ("h200", "sm9", "cuda", "other")
    )


def test_a_providers_plan_rows_are_its_tuned_ones_then_the_packaged_ones_for_the_device(
    plan_fragments: tuple[Any, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from magi2_core.profiles import DeviceKey, plan_rows

    def rows(name: str | None, capability: str | None, profile: str | None = None) -> tuple[list[str], str]:
        found = plan_rows(
            "moe_experts", "toy", DeviceKey("cuda", name, capability), profile=profile, backends=plan_fragments
        )
        return [str(r.plan["tag"]) for r in found.rows], found.source

    got, source = rows("NVIDIA H200", "9.0")
    assert got == ["h200"] and source == (
        "profile toy-h200 (magi2_test_plans/h200.json, measured on this device model)"
    )
    got, source = rows("NVIDIA H20", "9.0")  # the capability class's fragment refines the type-wide one
    assert got == ["sm9"] and source.startswith(
        "generic rows toy-sm9 (magi2_test_plans/sm9.json): no rows measured for cuda 'NVIDIA H20' 9.0; `magi2 tune`"
    )
    assert rows("NVIDIA B200", "10.0")[0] == ["cuda"] and rows(None, None)[0] == ["cuda"]
    assert rows("NVIDIA H100 80GB HBM3", "9.0")[0] == ["sm9"]  # a named fragment without toy rows: the generic ones
    assert rows("NVIDIA H200", "9.0", "generic")[0] == ["sm9"]  # the generic profile: the generic rows
    tuned = _write(
        tmp_path / "tuned.json",
        _plan_doc("tuned-h200", {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0"}, "tuned<=100", "bad"),
    )
    refused: list[str] = []

    def check(row: Any) -> str | None:
        refused.append(str(row.plan["tag"]))
        return "a plan this provider cannot read" if row.plan["tag"] == "bad" else None

    found = plan_rows(
        "moe_experts",
        "toy",
        DeviceKey("cuda", "NVIDIA H200", "9.0"),
        profile=str(tuned),
        check=check,
        backends=plan_fragments,
    )
    assert [r.plan["tag"] for r in found.rows] == ["tuned<=100", "h200"] and refused == ["tuned<=100", "bad", "h200"]
    assert found.source == (
        f"profile tuned-h200 (given: {tuned}) rows 1-1, then profile toy-h200 "
        "(magi2_test_plans/h200.json, measured on this device model)"
    )
    assert found.rows[0].provenance is not None and found.rows[0].provenance.kind == "tune"  # its file's
    with pytest.raises(ProfileError, match=r"toy-backend .*plans row 1 of toy for moe_experts: no"):
        plan_rows(
            "moe_experts",
            "toy",
            DeviceKey("cuda", "NVIDIA H200", "9.0"),
            check=lambda row: "no",
            backends=plan_fragments,
        )


def test_the_generic_profile_takes_a_backends_capability_class_fragment_in_place_of_its_type_wide_one(
    plan_fragments: tuple[Any, ...],
) -> None:
    from magi2_core.profiles import DeviceKey, profile_of

    loaded = profile_of(DeviceKey("cuda", "NVIDIA H20", "9.0"), plan_fragments)
    assert loaded.generic and [r.plan["tag"] for r in loaded.profile.plans] == ["sm9"]
    loaded = profile_of(DeviceKey("cuda", "NVIDIA B200", "10.0"), plan_fragments)
    assert [r.plan["tag"] for r in loaded.profile.plans] == ["cuda"]


def test_a_broken_fragment_quarantines_its_backend_only(fragments_pkg: str) -> None:
    reg = Registry(discover=False)
    reg.register(_fragment_backend("good-backend", f"{fragments_pkg}:alpha.json"), name="good")
    reg.register(_fragment_backend("bad-backend", f"{fragments_pkg}:broken.json"), name="bad")
    reg.register(_fragment_backend("lost-backend", f"{fragments_pkg}:absent.json"), name="lost")
    reg.register(_fragment_backend("odd-backend", "no-package-named"), name="odd")
    why = {q.entry_point: q.reason for q in reg.quarantined()}
    assert set(why) == {"bad", "lost", "odd"}
    assert "ProfileError" in why["bad"] and "broken.json" in why["bad"] and "version" in why["bad"]
    assert "absent.json" in why["lost"] and "cannot read" in why["lost"]
    assert "package:path" in why["odd"]
    assert [b.entry_point for b in reg.backends()] == ["good"]
    assert [f.profile.name for f in reg.state().profiles] == ["alpha-h200"]


def test_the_example_plugin_ships_a_fragment_through_its_entry_point() -> None:
    reg = m2.get_registry()
    if reg.provider("attention", "example_fpga") is None:
        pytest.skip("the example plugin (tests/plugins/example) is not installed")
    frag = next(f for f in reg.state().profiles if f.backend == "magi2-backend-example")
    assert frag.profile.name == "example-fpga" and frag.profile.device.name is None
    p = Problem(
        op="attention",
        device_type="fpga",
        dtype="bfloat16",
        tokens=128,
        tokens_k=128,
        max_seqlen_q=128,
        max_seqlen_k=128,
        num_segments=1,
        head_dim=128,
        num_heads_q=2,
        num_heads_kv=2,
    )
    res = resolve_problem(p)
    assert (res.chosen, res.decided_by) == ("example_fpga", "profile"), res.explain()
    assert res.preference is not None and res.preference.id == "example-fpga-tiles"
    assert res.profile is not None and res.profile.name == "generic-fpga"
    assert "magi2-backend-example" in res.profile.origin


def test_cli_explain_names_the_profile_in_text_and_json(monkeypatch) -> None:
    from typer.testing import CliRunner

    from magi2_core.cli import app

    _device(monkeypatch, *H200)
    args = ["explain", "attention", "--device", "cuda", "--tokens", "512", "--max-seqlen-q", "256", "--segments", "2"]
    text = CliRunner().invoke(app, args).stdout
    assert "profile: nvidia-h200 (shipped: magi2_core/profiles/nvidia-h200.json" in text
    assert "preference h200-short-work-2048x1024" in text and "benchmarks/results/attention_h200.json" in text
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert data["profile"]["name"] == "nvidia-h200" and data["preference"]["id"] == "h200-short-work-2048x1024"
    _device(monkeypatch, None, None)
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert data["profile"]["source"] == "generic" and data["preference"] is None
