"""Shadow verification: sampled re-runs on the reference catch a wrong provider; off costs nothing."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import bad_provider.plugin as bad_plugin
import pytest
import torch

import magi2_core as m2
from magi2_core import shadow  # the public path (docs/api.md)

BACKEND = "bad_example_shadow"


@pytest.fixture(autouse=True)
def _bad_backend() -> Iterator[None]:
    m2.get_registry().register(bad_plugin, name=BACKEND)
    shadow.reset_stats()
    yield
    m2.get_registry().unregister(BACKEND)
    shadow.configure(0.0)
    shadow.reset_stats()


def _attention_inputs() -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    q = torch.randn(12, 2, 32)
    k = torch.randn(15, 2, 32)
    v = torch.randn(15, 2, 32)
    cu_q = torch.tensor([0, 5, 12], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 15], dtype=torch.int32)
    sinks = torch.randn(2, 2) * 2
    return (q, k, v, cu_q, cu_k), sinks


def _norm_inputs() -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    return torch.randn(9, 32), torch.randn(2, 1, 32) * 0.2, [4, 5]


def test_off_by_default() -> None:
    assert shadow.is_active() is False
    args, sinks = _attention_inputs()
    m2.attention(*args, sinks=sinks, provider="bad_attention")
    assert shadow.stats().observed == 0


def test_wrong_provider_is_caught_at_rate_one() -> None:
    args, sinks = _attention_inputs()
    with shadow.shadow(rate=1.0), pytest.warns(shadow.ShadowMismatchWarning) as record:
        m2.attention(*args, sinks=sinks, provider="bad_attention")
    text = str(record[0].message)
    assert "attention provider 'bad_attention' is outside the contract" in text
    assert "attention output" in text
    s = shadow.stats()
    assert (s.sampled, s.compared, s.mismatches) == (1, 1, 1)
    assert s.by_provider["attention:bad_attention"]["mismatches"] == 1
    assert shadow.is_active() is False  # restored after the block


def test_raise_on_mismatch() -> None:
    x, w, sizes = _norm_inputs()
    with shadow.shadow(rate=1.0, raise_on_mismatch=True), pytest.raises(shadow.ShadowMismatchError) as info:
        m2.rmsnorm(x, w, modality_sizes=sizes, provider="bad_rmsnorm")
    assert isinstance(info.value, m2.Magi2Error)
    assert (info.value.op, info.value.provider) == ("rmsnorm", "bad_rmsnorm")
    assert "rmsnorm fp32" in info.value.metric


def test_correct_calls_pass_silently(recwarn: pytest.WarningsRecorder) -> None:
    args, _ = _attention_inputs()
    x, w, _sizes = _norm_inputs()
    with shadow.shadow(rate=1.0, raise_on_mismatch=True):
        m2.attention(*args, provider="bad_attention")  # without sinks and LSE its bugs do not show
        m2.rmsnorm(x, w[:1], provider="bad_rmsnorm")  # one modality: correct
    s = shadow.stats()
    assert (s.compared, s.mismatches, s.errors) == (2, 0, 0)
    assert not [w for w in recwarn if issubclass(w.category, shadow.ShadowMismatchWarning)]


def test_rate_zero_never_calls_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(shadow, "_reference_kernel", lambda op: calls.append(op))
    x, w, sizes = _norm_inputs()
    with shadow.shadow(rate=0.0):
        for _ in range(20):
            m2.rmsnorm(x, w, modality_sizes=sizes, provider="bad_rmsnorm")
    assert calls == []
    assert shadow.stats().observed == 0


def test_reference_provider_is_not_shadowed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(shadow, "_reference_kernel", lambda op: calls.append(op))
    x, w, sizes = _norm_inputs()
    with shadow.shadow(rate=1.0):
        m2.rmsnorm(x, w, modality_sizes=sizes, provider="reference")
    assert calls == []
    assert shadow.stats().skipped_reference == 1


def test_sampling_fraction() -> None:
    x, w, _ = _norm_inputs()
    with shadow.shadow(rate=0.25, seed=7):
        for _ in range(400):
            m2.rmsnorm(x, w[:1], provider="bad_rmsnorm")
    s = shadow.stats()
    assert s.observed == 400
    assert 60 <= s.sampled <= 140  # binomial(400, 0.25): mean 100, sd 8.7
    assert s.mismatches == 0


def test_env_variable_turns_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAGI2_SHADOW", "0.5")
    monkeypatch.setenv("MAGI2_SHADOW_RAISE", "1")
    m2.reload_config()
    assert shadow.is_active() is True
    x, w, sizes = _norm_inputs()
    with pytest.raises(shadow.ShadowMismatchError):
        for _ in range(64):  # sampled at 0.5: missing all 64 has probability 2**-64
            m2.rmsnorm(x, w, modality_sizes=sizes, provider="bad_rmsnorm")


def test_bad_rate_is_rejected() -> None:
    with pytest.raises(ValueError, match="shadow rate"):
        shadow.configure(1.5)


def test_scope_is_per_thread_and_nests() -> None:
    x, w, _ = _norm_inputs()
    seen: list[bool] = []

    def other_thread() -> None:
        seen.append(shadow.is_active())
        m2.rmsnorm(x, w[:1], provider="bad_rmsnorm")  # not inside this thread's scope: not observed

    with shadow.shadow(rate=1.0):
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        with shadow.shadow(rate=0.0):  # the innermost scope wins
            m2.rmsnorm(x, w[:1], provider="bad_rmsnorm")
            assert not shadow.is_active()
        m2.rmsnorm(x, w[:1], provider="bad_rmsnorm")
        assert shadow.settings() == (1.0, False)
    assert seen == [False]
    assert shadow.stats().observed == 1  # only the call in the outer scope of this thread


def test_process_setting_applies_outside_scopes_and_in_other_threads() -> None:
    x, w, _ = _norm_inputs()
    shadow.configure(1.0)
    worker = threading.Thread(target=lambda: m2.rmsnorm(x, w[:1], provider="bad_rmsnorm"))
    worker.start()
    worker.join()
    with shadow.shadow(rate=0.0):
        m2.rmsnorm(x, w[:1], provider="bad_rmsnorm")
    assert shadow.stats().observed == 1


def test_the_public_name_is_the_selection_module() -> None:
    """``from magi2_core import shadow`` and ``m2.shadow`` are the module in ``magi2_core.selection``."""
    import magi2_core.selection.shadow as module

    assert shadow is module
    assert m2.shadow is module
