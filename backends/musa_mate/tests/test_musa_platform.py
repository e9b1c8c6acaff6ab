"""Platform detection: MUSA is detected without importing anything, torchada only ever on MUSA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import ModuleType

import pytest
import torch
from magi2_backend_musa_mate import platform
from magi2_backend_musa_mate.provider import mate_attention
from musa_fakes import MusaWorld

import magi2_core as m2
from magi2_core.model.problem import Problem
from magi2_core.reasons import ReasonCode

_TORCHADA_ENV = ("SGLANG_MOE_CONFIG_DIR", "VLLM_TUNED_CONFIG_FOLDER")


def _musa_problem() -> Problem:
    return Problem(
        op="attention",
        device_type="musa",
        dtype="bfloat16",
        tokens=64,
        tokens_k=64,
        max_seqlen_q=64,
        max_seqlen_k=64,
        num_segments=1,
        head_dim=128,
        num_heads_q=4,
        num_heads_kv=4,
    )


def test_cpu_machine_is_not_musa(world: MusaWorld) -> None:
    world.platform(False)
    assert not platform.musa_installed()


def test_torch_version_musa_means_musa(world: MusaWorld) -> None:
    world.platform(True)
    assert platform.musa_installed()
    assert world.finder.imported == []


def test_installed_torch_musa_means_musa_without_importing_it(world: MusaWorld) -> None:
    world.monkeypatch.setattr(torch.version, "musa", None, raising=False)
    world.finder.modules["torch_musa"] = ModuleType("torch_musa")
    assert platform.musa_installed()
    assert "torch_musa" not in world.finder.imported and "torch_musa" not in sys.modules


def test_runtime_refuses_to_import_torchada_off_musa(world: MusaWorld) -> None:
    world.platform(False)
    world.runtime(torch_musa=False)  # torchada itself "installed": it must still not be imported
    with pytest.raises(RuntimeError, match="torchada is not imported"):
        platform.import_musa_runtime()
    assert world.finder.imported == []


def test_check_off_musa_imports_nothing_and_rejects(world: MusaWorld) -> None:
    world.platform(False)
    world.runtime(torch_musa=False)
    world.mate(None)
    env_before = {v: os.environ.get(v) for v in _TORCHADA_ENV}
    reasons = mate_attention.check(_musa_problem())
    assert [r.code for r in reasons] == [ReasonCode.UNAVAILABLE]
    assert "not a MUSA platform" in reasons[0].detail
    assert world.finder.imported == []
    assert {v: os.environ.get(v) for v in _TORCHADA_ENV} == env_before


def test_on_musa_torchada_comes_first(world: MusaWorld) -> None:
    world.musa_with("v0.2.2")
    assert mate_attention.check(_musa_problem()) == []
    assert world.finder.imported == ["torchada", "torch_musa", "mate", "mate.mha_interface"]


def test_torchada_cuda_alias_does_not_change_the_device_type(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchada patches ``Tensor.is_cuda`` to True; the core must keep using ``device.type``."""
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    q = torch.randn(40, 4, 64).to(torch.bfloat16)
    k = torch.randn(40, 2, 64).to(torch.bfloat16)
    v = torch.randn(40, 2, 64).to(torch.bfloat16)
    cu = torch.tensor([0, 40], dtype=torch.int32)
    assert q.is_cuda  # the alias is active
    res = m2.resolve("attention", q, k, v, cu, cu)
    assert res.problem.device_type == "cpu"
    cuda_only = {p.name for p in m2.get_registry().providers("attention") if p.capability.device_types == ("cuda",)}
    assert res.chosen not in cuda_only and res.chosen is not None


def test_fresh_process_never_imports_torchada_mate_or_torch_musa() -> None:
    """Discovery, a CPU attention call and a MUSA resolution, in a clean interpreter on this CPU machine."""
    script = textwrap.dedent(
        """
        import importlib.abc, json, os, sys
        attempts = []
        class Spy(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torchada", "mate", "torch_musa"):
                    attempts.append(name)
                return None
        sys.meta_path.insert(0, Spy())
        import torch
        import magi2_core as m2
        from magi2_core.model.problem import Problem
        from magi2_core.selection.resolver import resolve_problem
        q = torch.randn(40, 4, 64).to(torch.bfloat16)
        kv = torch.randn(40, 2, 64).to(torch.bfloat16)
        cu = torch.tensor([0, 40], dtype=torch.int32)
        o = m2.attention(q, kv, kv, cu, cu, sinks=torch.randn(1, 4))
        p = Problem(op="attention", device_type="musa", dtype="bfloat16", tokens=64, tokens_k=64, max_seqlen_q=64,
                    max_seqlen_k=64, num_segments=1, head_dim=128, num_heads_q=4, num_heads_kv=4)
        res = resolve_problem(p)
        mate = next(c for c in res.candidates if c.provider == "mate")
        print(json.dumps({
            "attempts": attempts, "chosen": res.chosen, "mate": [r.code.value for r in mate.reasons],
            "modules": [m for m in ("torchada", "mate", "torch_musa") if m in sys.modules],
            "env": [v for v in ("SGLANG_MOE_CONFIG_DIR", "VLLM_TUNED_CONFIG_FOLDER") if v in os.environ],
            "finite": bool(o.isfinite().all()),
        }))
        """
    )
    env = {k: v for k, v in os.environ.items() if k not in _TORCHADA_ENV and not k.startswith("MAGI2_")}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    # find_spec("torch_musa") is the detection itself; anything else would be an import.
    assert [a for a in out["attempts"] if a != "torch_musa"] == []
    assert out["modules"] == [] and out["env"] == []
    assert out["chosen"] == "reference" and out["mate"] == ["unavailable"]
    assert out["finite"]
