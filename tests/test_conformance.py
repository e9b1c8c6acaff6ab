"""The conformance kit: it passes the reference, fails a wrong provider readably, catches over-claims."""

from __future__ import annotations

import time
from collections.abc import Iterator

import bad_provider.plugin as bad_plugin
import pytest
import torch

import magi2_core as m2
from magi2_core.model.capability import Capability, Condition, IntRange, Provenance, Rule
from magi2_core.model.problem import Feature
from magi2_core.testing import registered_backend, rehost, run_kit
from magi2_core.testing import runner as kit_runner
from magi2_core.testing.inputs import build_call
from magi2_core.testing.op_cases import generate_cases, problem_of

pytest_plugins = ["pytester", "magi2_core.testing.plugin"]

BACKEND = "bad_example"


@pytest.fixture
def bad_backend() -> Iterator[None]:
    m2.get_registry().register(bad_plugin, name=BACKEND)
    yield
    m2.get_registry().unregister(BACKEND)


# ---------------------------------------------------------------------------------------------
# the reference passes, fast
# ---------------------------------------------------------------------------------------------
def test_reference_passes_the_whole_kit() -> None:
    start = time.perf_counter()
    report = run_kit(["reference"], devices=["cpu"], seed=0)
    elapsed = time.perf_counter() - start
    assert report.ok, report.format()
    ops = {r.case.op for r in report.results}
    assert ops == {
        "attention",
        "moe_route",
        "moe_experts",
        "rmsnorm",
        "mhc_pre",
        "mhc_mix",
        "qk_norm_rope",
        "output_gate",
    }
    assert len(report.results) > 100
    assert elapsed < 60
    labels = {r.case.id for r in report.results}
    for expected in (
        "attention[reference]-cpu-bfloat16-d32-t0-all-features",
        "attention[reference]-cpu-float16-d64-ragged-sinks2",
        "attention[reference]-cpu-float32-d64-ragged-gqa",
        "moe_experts[reference]-cpu-bfloat16-hot-expert",
        "rmsnorm[reference]-cpu-bfloat16-modalities-empty-group",
        "rmsnorm[reference]-cpu-float32-rejects-invalid-inputs",
        "mhc_pre[reference]-cpu-bfloat16-n4-modalities-empty-group-out-float32",
        "mhc_mix[reference]-cpu-float16-nonfinite-streams-coef-float32",
        "qk_norm_rope[reference]-cpu-bfloat16-partial-3-modalities-out-float32",
        "output_gate[reference]-cpu-float16-strided-views-out-float32",
    ):
        assert expected in labels


def test_cases_cover_every_claim() -> None:
    cap = m2.get_registry().provider("attention", "reference").capability  # type: ignore[union-attr]
    cases = generate_cases(cap, "cpu")
    assert {c.dtype for c in cases} == set(cap.dtypes)
    problems = [problem_of(c) for c in cases]
    for feature in (Feature.SOFTCAP, Feature.SINKS, Feature.GQA, Feature.LSE, Feature.DETERMINISTIC):
        assert any(feature in p.features for p in problems), feature
    assert {c.p["sinks"] for c in cases} >= {0, 1, 2}
    assert any(p.tokens == 0 for p in problems)
    assert any(0 in c.p["seqlens_q"] and sum(c.p["seqlens_q"]) > 0 for c in cases)


def test_cases_reproduce_from_the_seed() -> None:
    cap = m2.get_registry().provider("rmsnorm", "reference").capability  # type: ignore[union-attr]
    case = generate_cases(cap, "cpu")[0]
    a = build_call(case, kit_runner.case_seed(5, case.id))
    b = build_call(case, kit_runner.case_seed(5, case.id))
    c = build_call(case, kit_runner.case_seed(6, case.id))
    assert torch.equal(a.args[0], b.args[0])
    assert not torch.equal(a.args[0], c.args[0])


# ---------------------------------------------------------------------------------------------
# the deliberately wrong example backend fails, readably
# ---------------------------------------------------------------------------------------------
@pytest.mark.usefixtures("bad_backend")
def test_bad_attention_fails_with_a_readable_report() -> None:
    report = run_kit(["bad_attention"], seed=0)
    assert not report.ok
    text = report.format()
    # The LSE layout bug: named output, actual and contract layouts.
    assert "FAILED: output 'lse' is float32[32, 4]; the contract says float32[4, 32]" in text
    # The forgotten sinks: the acceptance rule's metric, with where and by how much.
    assert "attention[bad_attention]-cpu-float32-d64-ragged-sinks1" in text
    assert "disagrees with the reference beyond the contract: FAIL attention output:" in text
    assert "outside rtol=2e-05, atol=2e-05; first at" in text
    # Provider, backend, device and how to reproduce one case.
    assert "attention provider 'bad_attention' (backend magi2-backend-bad-example 0.0.1) on cpu" in text
    assert '--magi2-seed 0 -k "attention[bad_attention]-cpu-float32-d64-ragged-sinks1"' in text
    assert "sinks: float32[1, 2]" in text
    # Calls without sinks or LSE are right, and pass.
    passed = {r.case.id for r in report.results if r.status == "passed"}
    assert "attention[bad_attention]-cpu-float32-d32-ragged" in passed
    assert all("sinks" in r.case.id or "lse" in r.case.id or "all-features" in r.case.id for r in report.failed)


@pytest.mark.usefixtures("bad_backend")
def test_bad_rmsnorm_fails_only_where_modalities_matter() -> None:
    report = run_kit(["bad_rmsnorm"], seed=3)
    failed = {r.case.id for r in report.failed}
    assert "rmsnorm[bad_rmsnorm]-cpu-float32-modalities-empty-group" in failed
    assert "rmsnorm[bad_rmsnorm]-cpu-bfloat16-2d" not in failed
    assert "FAIL <= 1 ulp" in report.format() or "FAIL rmsnorm fp32" in report.format()


@pytest.mark.usefixtures("bad_backend")
def test_over_claim_is_a_failure() -> None:
    report = run_kit(["overclaim_attention"], seed=0)
    failed = report.failed
    assert failed and all(r.case.dtype == "float16" for r in failed)
    assert any(r.status == "passed" and r.case.dtype == "bfloat16" for r in report.results)
    text = failed[0].report
    assert "OVER-CLAIM: the descriptor claims this case but the provider refused it at run time" in text
    assert "[check] dtype: needs bfloat16 | float32, got float16 (this build has no fp16 kernels)" in text


def test_rules_make_cases_ineligible_not_failed() -> None:
    ref = m2.get_registry().provider("attention", "reference").capability  # type: ignore[union-attr]
    cap = ref.model_copy(
        update={
            "name": "ranged_reference",
            "backend": "",
            "ranges": (IntRange(field="max_seqlen_q", min=4, max=40),),
            "rules": (
                Rule(
                    id="short-keys",
                    when=(Condition(field="max_seqlen_k", op="lt", value=16),),
                    reason="too short",
                    provenance=Provenance(kind="policy", source="test"),
                ),
            ),
        }
    )
    with registered_backend(cap, name="ranged"):
        report = run_kit(["ranged_reference"], ops=["attention"])
    assert report.ok, report.format()
    ineligible = [r for r in report.results if r.status == "ineligible"]
    assert ineligible and all("short-keys" in " ".join(r.checks) for r in ineligible)
    runs = [r for r in report.results if r.status == "passed" and not r.case.id.endswith("invalid-inputs")]
    assert runs
    for r in runs:
        p = problem_of(r.case)  # type: ignore[arg-type]
        assert 4 <= p.max_seqlen_q <= 40  # type: ignore[operator]
        assert p.max_seqlen_k >= 16  # type: ignore[operator]
    ids = {r.case.id for r in report.results}
    assert any("-lq40" in i for i in ids) and any("-lq4" in i for i in ids)  # both range ends


def test_absent_device_is_skipped_with_the_reason() -> None:
    with registered_backend(rehost("rmsnorm", "reference", device_types=("fpga_test",), name="fpga_norm"), name="fpga"):
        report = run_kit(["fpga_norm"])
    assert report.ok and not report.results
    assert "device types ['fpga_test'] not present here (available: ['cpu'" in report.format()


def test_an_accepted_invalid_call_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def valid_call(op: str, dtype: str, device: str, seed: int) -> dict[str, object]:
        x = torch.randn(4, 8)
        return {"a valid call": kit_runner.Call((x, torch.zeros(1, 1, 8)), {})}

    monkeypatch.setattr(kit_runner, "invalid_calls", valid_call)
    report = run_kit(["reference"], ops=["rmsnorm"])
    [failure] = report.failed
    assert "invalid call (a valid call) was accepted; it must raise an InvalidInputError" in failure.report


def test_unknown_provider_lists_the_installed_ones() -> None:
    with pytest.raises(ValueError, match=r"no installed provider named \['nope'\].*installed: .*'reference'"):
        run_kit(["nope"])


# ---------------------------------------------------------------------------------------------
# through pytest, as a vendor runs it
# ---------------------------------------------------------------------------------------------
def test_pytest_plugin_passes_the_reference(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(
        "-p",
        "magi2_core.testing.plugin",
        "--magi2-provider",
        "reference",
        "--magi2-op",
        "rmsnorm",
        "--magi2-seed",
        "11",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(passed=49)
    result.stdout.fnmatch_lines(
        [
            "magi2 conformance: seed 11 (reproduce with --magi2-seed 11)",
            "magi2 conformance: 49 cases for rmsnorm[[]reference[]]@cpu; 0 provider(s) skipped",
        ]
    )


@pytest.mark.usefixtures("bad_backend")
def test_pytest_plugin_fails_the_bad_provider(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    pass\n")
    result = pytester.runpytest(
        "-p",
        "magi2_core.testing.plugin",
        "--magi2-provider",
        "bad_rmsnorm",
        "--magi2-only",
        "-k",
        "float32",
        "-p",
        "no:cacheprovider",
    )
    outcomes = result.parseoutcomes()
    assert outcomes["failed"] >= 4 and outcomes["passed"] >= 4 and "test_own" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "*magi2 conformance: rmsnorm provider 'bad_rmsnorm' (backend magi2-backend-bad-example 0.0.1)"
            " on cpu, float32",
            "case: rmsnorm[[]bad_rmsnorm[]]-cpu-float32-modalities-empty-group",
            "FAILED: disagrees with the reference beyond the contract: FAIL rmsnorm fp32: *outside rtol=1e-06*",
        ]
    )
    assert result.ret == pytest.ExitCode.TESTS_FAILED


@pytest.mark.usefixtures("bad_backend")
def test_pytest_plugin_over_claim_and_skips(pytester: pytest.Pytester) -> None:
    with registered_backend(rehost("rmsnorm", "reference", device_types=("fpga_test",), name="fpga_norm"), name="fpga"):
        result = pytester.runpytest(
            "-p",
            "magi2_core.testing.plugin",
            "--magi2-provider",
            "overclaim_attention",
            "--magi2-provider",
            "fpga_norm",
            "-rs",
            "-k",
            "ragged or skipped",
            "-p",
            "no:cacheprovider",
        )
    result.stdout.fnmatch_lines(["*OVER-CLAIM*", "*fpga_norm*not present here*"])
    assert result.parseoutcomes()["failed"] >= 1


def test_pytest_plugin_is_inert_without_options(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    pass\n")
    result = pytester.runpytest("-p", "magi2_core.testing.plugin", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "magi2 conformance" not in result.stdout.str()


def test_pytest_plugin_reports_an_unknown_name(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "magi2_core.testing.plugin", "--magi2-provider", "nope", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no installed provider named [[]'nope'[]]*"])


def test_feature_flags_reach_the_provider() -> None:
    """The kit's sinks/LSE cases really exercise sinks: a sink-free answer differs from the reference."""
    cap = m2.get_registry().provider("attention", "reference").capability  # type: ignore[union-attr]
    case = next(c for c in generate_cases(cap, "cpu") if c.id.endswith("float32-d64-ragged-sinks2"))
    call = build_call(case, 1)
    with_sinks = m2.attention(*call.args, **call.kwargs, provider="reference")
    call.kwargs["sinks"] = None
    without = m2.attention(*call.args, **call.kwargs, provider="reference")
    assert not torch.allclose(with_sinks, without, rtol=1e-3, atol=1e-3)


_ = Capability  # re-exported for readers of this module: the descriptors above are Capability copies
