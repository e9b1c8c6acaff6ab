"""Explain for a device this host does not have (``--device-name``, ``--capability``, ``--profile``), and
why a device gets its profile. The devices are described, never present: these hold on any host."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import magi2_core as m2
from magi2_core import BackendSpec, Capability, Problem
from magi2_core.cli import app
from magi2_core.model.devices import absent_device, cuda_available, device_identity
from magi2_core.model.virtual_device import VirtualDevice
from magi2_core.profiles import active_profile, reset_profiles, shipped_profiles
from magi2_core.profiles.described import describe_device
from magi2_core.reasons import Reason, ReasonCode
from magi2_core.selection.registry import Registry, get_registry
from magi2_core.selection.resolver import resolve_problem
from magi2_core.testing import InProcessBackend

runner = CliRunner()
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No user profile of this machine, no MAGI2_PROFILE, every profile cache fresh."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("MAGI2_PROFILE", raising=False)
    m2.reload_config()
    yield
    reset_profiles()


def _needs(*providers: tuple[str, str]) -> None:
    state = get_registry().state()
    missing = [f"{op}:{name}" for op, name in providers if state.provider(op, name) is None]  # type: ignore[arg-type]
    if missing:
        pytest.skip(f"needs the providers {missing} installed")


def _explain(*args: str) -> tuple[str, dict[str, Any]]:
    """The text (whitespace folded, as the terminal may wrap it) and the JSON of one explain."""
    text = runner.invoke(app, ["explain", *args])
    assert text.exit_code == 0, text.output
    data = runner.invoke(app, ["explain", *args, "--json"])
    assert data.exit_code == 0, data.output
    return " ".join(text.stdout.split()), json.loads(data.stdout)


def _has_shipped(name: str) -> bool:
    return any(f.profile.device.name == name for f in shipped_profiles())


# ---------------------------------------------------------------------------------------------
# the devices of the issue: the H200, the H100, an unknown 9.x device, a 10.x device
# ---------------------------------------------------------------------------------------------
def test_the_h200_moe_experts_shows_the_plan_row_and_its_provenance() -> None:
    _needs(("moe_experts", "triton"))
    text, data = _explain("moe_experts", "--device", "cuda", "--device-name", "NVIDIA H200")
    assert "device: cuda NVIDIA H200 (capability 9.0, from profile nvidia-h200) - described, not this host's" in text
    assert "profile: nvidia-h200 (shipped: magi2_core/profiles/nvidia-h200.json" in text
    assert "why this profile: NVIDIA H200 (capability 9.0): a shipped profile names this device and capability" in text
    assert data["chosen"] == "triton" and data["candidates"][0]["reasons"] == []  # not "unavailable" here
    assert "there is no cuda device on this host" not in text
    why = data["plan"]["why"]
    assert why.startswith(
        "profile nvidia-h200 (magi2_backend_triton/profiles/nvidia-h200.json, measured on this device model); row "
    )
    assert "[provenance: benchmark: benchmarks/results/" in why
    assert f"plan (triton): {data['plan']['variant']} (" in text
    assert data["described"] == {
        "type": "cuda",
        "name": "NVIDIA H200",
        "capability": "9.0",
        "capability_from": "from profile nvidia-h200",
        "profile": None,
    }


def test_the_h100_gets_its_shipped_profile_and_says_why() -> None:
    _needs(("moe_experts", "triton"), ("attention", "fa3"), ("attention", "torch_varlen"))
    text, data = _explain("moe_experts", "--device", "cuda", "--device-name", H100)
    assert data["described"]["capability"] == "9.0"
    assert data["described"]["capability_from"] == "from profile nvidia-h100"
    assert "profile: nvidia-h100 (shipped: magi2_core/profiles/nvidia-h100.json" in text
    assert data["profile"]["why"] == f"{H100} (capability 9.0): a shipped profile names this device and capability"
    assert (
        "tune: benchmarks/results/tuning/profile_tuned_h100_e6abbd8.json, 2026-12-06" in data["profile"]["provenance"]
    )
    assert "commit e6abbd8" in data["profile"]["provenance"]
    assert data["chosen"] == "triton"
    why = data["plan"]["why"]  # 4096 tokens, 3 heads: the tune's row for up to 181 routes per expert
    assert why.startswith(
        "profile nvidia-h100 (magi2_backend_triton/profiles/nvidia-h100.json, measured on this device model); row 2 "
    )
    assert f"measured by `magi2 tune` on an {H100}" in why
    assert "[provenance: tune: benchmarks/results/tuning/profile_tuned_h100_e6abbd8.json, 2026-12-06" in why
    assert data["plan"]["variant"] == "gluon_ws"
    _, data = _explain("attention", "--device", "cuda", "--device-name", H100, "--tokens", "512")
    assert (data["decided_by"], data["preference"]["id"], data["chosen"]) == (
        "profile",
        "h100-tune-attention-1",
        "torch_varlen",
    )
    text, data = _explain("attention", "--device", "cuda", "--device-name", H100, "--sinks")
    fa3 = next(c for c in data["candidates"] if c["provider"] == "fa3")
    assert (data["chosen"], fa3["verdict"], fa3["reasons"]) == ("fa3", "chosen", [])
    assert data["preference"]["id"] == "h100-tune-attention-4"
    assert fa3["notes"] and ("no FA3 build imports here" in fa3["notes"][0] or "this host's build" in fa3["notes"][0])
    assert "note: " in text


@pytest.mark.parametrize("name", ["NVIDIA H100 PCIe", "NVIDIA H100 NVL"])
def test_another_h100_gets_the_generic_hopper_profile_and_says_why(name: str) -> None:
    _needs(("moe_experts", "triton"))
    _, data = _explain("moe_experts", "--device", "cuda", "--device-name", name)
    assert data["described"]["capability"] == "9.0" and data["described"]["capability_from"] == "known device names"
    assert data["profile"]["why"] == (
        f"{name} (capability 9.0): no user or shipped profile for this device name and "
        "capability -> generic-cuda-9.0 (the generic profile of cuda capability 9.0)"
    )
    assert data["chosen"] == "triton"
    assert data["plan"]["why"].startswith(
        f"generic rows generic-cuda-sm90 (magi2_backend_triton/profiles/"
        f"generic-cuda-sm90.json): no rows measured for cuda '{name}' 9.0"
    )
    assert "[provenance: benchmark: benchmarks/results/profile_check_*_h200.json, *_h100*.json" in data["plan"]["why"]


def test_an_unknown_9x_device_needs_its_capability_then_gets_the_generic_hopper_profile() -> None:
    _needs(("moe_experts", "triton"))
    result = runner.invoke(app, ["explain", "moe_experts", "--device", "cuda", "--device-name", "NVIDIA H999"])
    assert result.exit_code == 2
    assert "'NVIDIA H999': its compute capability is not known here" in result.output and "9.0" in result.output
    _, data = _explain("moe_experts", "--device", "cuda", "--device-name", "NVIDIA H999", "--capability", "9.0")
    assert data["described"]["capability_from"] == "given" and data["profile"]["name"] == "generic-cuda-9.0"
    assert data["plan"]["why"].startswith("generic rows generic-cuda-sm90")
    _, data = _explain("moe_experts", "--device", "cuda", "--capability", "9.0")  # no name at all
    assert data["profile"]["why"].startswith("no cuda device name known here -> generic-cuda-9.0")


def test_a_blackwell_device_gets_fa4_for_attention_and_the_portable_moe_rows() -> None:
    _needs(("moe_experts", "triton"), ("attention", "fa3"), ("attention", "fa4"))
    _, data = _explain("attention", "--device", "cuda", "--device-name", "NVIDIA B200")
    assert (data["profile"]["name"], data["chosen"]) == ("generic-cuda-10.0", "fa4")
    fa3 = next(c for c in data["candidates"] if c["provider"] == "fa3")
    assert [(r["field"], r["actual"]) for r in fa3["reasons"]] == [("compute_capability", "10.0")]
    _, data = _explain("moe_experts", "--device", "cuda", "--device-name", "NVIDIA B200")
    assert data["plan"]["why"].startswith("generic rows generic-cuda (") and not data["plan"]["variant"].startswith(
        "gluon"
    )


# ---------------------------------------------------------------------------------------------
# --profile
# ---------------------------------------------------------------------------------------------
def _profile_file(path: Path, device: dict[str, str], prefer: str) -> Path:
    path.write_text(
        json.dumps(
            {
                "format": "magi2-profile",
                "version": 1,
                "name": "mine",
                "device": device,
                "provenance": {"kind": "tune", "source": "test"},
                "preferences": [{"op": "attention", "id": "mine-1", "prefer": [prefer], "why": "measured here"}],
            }
        )
    )
    return path


def test_a_given_profile_file_decides_in_place_of_magi2_profile(tmp_path: Path) -> None:
    _needs(("attention", "torch_varlen"))
    path = _profile_file(
        tmp_path / "mine.json", {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0"}, "torch_varlen"
    )
    text, data = _explain("attention", "--device", "cuda", "--device-name", "NVIDIA H200", "--profile", str(path))
    assert (data["profile"]["name"], data["profile"]["source"], data["decided_by"]) == ("mine", "given", "profile")
    assert data["chosen"] == "torch_varlen" and data["profile"]["why"] == f"--profile names {path}"
    assert "profile: mine (given to explain: " in text
    _, data = _explain("attention", "--device", "cuda", "--device-name", "NVIDIA H200", "--profile", "generic")
    assert data["profile"]["name"] == "generic-cuda-9.0" and data["profile"]["why"].startswith("--profile=generic")
    _, data = _explain("attention", "--device", "cuda", "--profile", str(path))  # this host's cuda device, if any
    assert data["described"]["name"] == device_identity("cuda")[0] and data["profile"]["name"] == "mine"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--profile", "nvidia-h999"], "no shipped profile has that name; shipped for cuda: generic, "),
        (["--profile", "MUSA"], "is for musa devices, not cuda"),
        (["--profile", "NOFILE"], "NOFILE"),
        (["--device-name", "NVIDIA H200", "--capability", "nine"], "give it as MAJOR.MINOR"),
    ],
)
def test_a_described_device_that_cannot_be_explained_is_a_usage_error(
    tmp_path: Path, args: list[str], words: str
) -> None:
    musa = _profile_file(tmp_path / "musa.json", {"type": "musa"}, "mate")
    args = [{"MUSA": str(musa), "NOFILE": str(tmp_path / "none.json")}.get(a, a) for a in args]
    words = words.replace("NOFILE", str(tmp_path / "none.json"))
    result = runner.invoke(app, ["explain", "attention", "--device", "cuda", *args])
    assert result.exit_code == 2 and words in " ".join(result.output.split()), result.output


# ---------------------------------------------------------------------------------------------
# the Python API, a provider without check_on, and the real path left alone
# ---------------------------------------------------------------------------------------------
class HostChecked:
    """A plugin kernel whose ``check`` reads this host only: the device's absence, and one real limit."""

    def check(self, problem: Problem) -> list[Reason]:
        limit = Reason(code=ReasonCode.CHECK, field="dtype", expected="bfloat16", actual=problem.dtype)
        return [*absent_device(problem.device_type), *([limit] if problem.dtype != "bfloat16" else [])]

    def __call__(self, call: Any) -> torch.Tensor:
        raise AssertionError("explain runs no kernel")


def test_a_provider_without_check_on_is_judged_by_its_check_without_the_absent_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("magi2_host_checked")
    module.kernel = HostChecked()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    reg = Registry(discover=False)
    reg.register(
        InProcessBackend(
            BackendSpec(
                name="acme",
                version="0",
                core_api=">=2.0,<3",
                providers=(
                    Capability(
                        op="rmsnorm",
                        name="acme",
                        impl="magi2_host_checked:kernel",
                        device_types=("cuda",),
                        dtypes=("bfloat16", "float32"),
                        priority=50,
                    ),
                ),
            )
        ),
        name="acme",
    )
    device = VirtualDevice(type="cuda", name="NVIDIA H200", capability="9.0")
    norm = dict(op="rmsnorm", device_type="cuda", tokens=16, width=64, num_modalities=1, num_patterns=1)
    res = resolve_problem(Problem(dtype="bfloat16", **norm), registry=reg, device=device)
    (acme,) = res.candidates
    assert (res.chosen, acme.reasons) == ("acme", ())
    assert "judged by its check on this host" in acme.notes[0] and "was set aside" in acme.notes[0]
    with pytest.raises(m2.NoEligibleProviderError) as err:  # its own limit still rejects
        resolve_problem(Problem(dtype="float32", **norm), registry=reg, device=device)
    assert err.value.resolution is not None and err.value.resolution.candidates[0].reasons[0].field == "dtype"
    # the same provider on this host's (absent) device: rejected as before
    with pytest.raises(m2.NoEligibleProviderError):
        resolve_problem(Problem(dtype="bfloat16", **norm), registry=reg)
    with pytest.raises(ValueError, match="describe a musa device"):
        resolve_problem(Problem(dtype="bfloat16", **norm | {"device_type": "musa"}), registry=reg, device=device)


@pytest.mark.skipif(cuda_available(), reason="compares with this host's own resolution, which has no CUDA device")
def test_every_explain_says_why_the_device_gets_its_profile_and_a_described_one_leaves_the_host_alone() -> None:
    res = m2.resolve("rmsnorm", torch.ones(4, 8), torch.zeros(8))
    assert (
        res.profile is not None
        and res.profile.why == "no cpu device name known here -> generic-cpu (the generic profile of any cpu device)"
    )
    assert "why this profile: no cpu device name known here -> generic-cpu" in res.explain()
    before = active_profile("cuda")
    device = describe_device("cuda", "NVIDIA H200")
    res = resolve_problem(
        Problem(
            op="rmsnorm",
            device_type="cuda",
            dtype="bfloat16",
            tokens=16,
            width=64,
            num_modalities=1,
            num_patterns=1,
            out_dtype="bfloat16",
        ),
        device=device,
    )
    assert res.described == device and res.profile is not None and res.profile.name == "nvidia-h200"
    assert "described, not this host's" in res.explain()
    assert active_profile("cuda") is before and before.name == "generic-cuda"  # this host: no cuda device
    real = resolve_problem(
        Problem(
            op="rmsnorm",
            device_type="cuda",
            dtype="bfloat16",
            tokens=16,
            width=64,
            num_modalities=1,
            num_patterns=1,
            out_dtype="bfloat16",
        )
    )
    assert real.described is None and real.chosen == "reference"
    assert all(c.verdict.value != "chosen" for c in real.candidates if c.provider != "reference")
