"""The magi2 command line, through typer's runner (no subprocess)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from magi2_core.cli import app

runner = CliRunner()


def test_backends_json_lists_providers_and_quarantine() -> None:
    result = runner.invoke(app, ["backends", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    entry_points = {b["entry_point"] for b in data["backends"]}
    assert "reference" in entry_points
    ref = next(b for b in data["backends"] if b["entry_point"] == "reference")
    assert {(p["op"], p["name"]) for p in ref["providers"]} >= {("attention", "reference"), ("rmsnorm", "reference")}
    if any(q["entry_point"] == "broken_import" for q in data["quarantined"]):
        assert all(q["reason"] for q in data["quarantined"])


def test_backends_table_exits_zero_with_a_broken_plugin_installed() -> None:
    result = runner.invoke(app, ["backends"])
    assert result.exit_code == 0
    assert "magi2-backend-reference" in result.stdout


def test_explain_musa_short_sequence_picks_reference_and_names_the_rule() -> None:
    result = runner.invoke(
        app, ["explain", "attention", "--device", "musa", "--dtype", "bfloat16", "--max-seqlen-q", "16", "--sinks"]
    )
    assert result.exit_code == 0, result.output
    assert "chosen: reference" in result.stdout
    if "mate" in result.stdout:  # the MATE backend is installed: its 32-token rule must be named
        assert "max_seqlen_q < 32" in result.stdout


def test_explain_json_and_long_sequence() -> None:
    result = runner.invoke(app, ["explain", "attention", "--device", "musa", "--max-seqlen-q", "4096", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["problem"]["max_seqlen_q"] == 4096 and data["chosen"]
    assert all(c["verdict"] in {"chosen", "rejected", "skipped"} for c in data["candidates"])


def test_explain_unknown_op_and_unservable_problem() -> None:
    assert runner.invoke(app, ["explain", "convolution"]).exit_code != 0
    result = runner.invoke(app, ["explain", "rmsnorm", "--provider", "torch_native", "--device", "cpu"])
    assert result.exit_code == 1 and "torch_native" in result.stdout


@pytest.mark.parametrize("op", ["moe_route", "moe_experts", "rmsnorm"])
def test_explain_each_op(op: str) -> None:
    result = runner.invoke(app, ["explain", op, "--device", "cpu", "--dtype", "float32"])
    assert result.exit_code == 0, result.output
    assert f"{op}:" in result.stdout


def test_demo_json_reports_each_op_against_the_oracle() -> None:
    result = runner.invoke(app, ["demo", "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    ops = ["mhc_pre", "rmsnorm", "qk_norm_rope", "qk_norm_rope", "attention", "output_gate", "mhc_mix"]
    ops += ["mhc_pre", "rmsnorm", "moe_route", "moe_experts", "mhc_mix"]
    assert [r["op"] for r in rows] == ops
    assert {r["provider"] for r in rows} == {"reference"}
    for r in rows:
        assert r["rel_l2_err"] < 1e-5, r  # FP32 on the CPU reference vs the float64 oracle


def test_explain_generic_feature_and_field_options() -> None:
    result = runner.invoke(
        app,
        [
            "explain",
            "attention",
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--json",
            "--feature",
            "sinks",
            "--field",
            "head_dim=48",
            "--field",
            "num_segments=3",
        ],
    )
    assert result.exit_code == 0, result.output
    problem = json.loads(result.stdout)["problem"]
    assert problem["head_dim"] == 48 and problem["num_segments"] == 3 and "sinks" in problem["features"]
    wrong = runner.invoke(app, ["explain", "rmsnorm", "--field", "num_experts=3"])
    assert wrong.exit_code != 0 and "num_experts=3" in wrong.output and "width" in wrong.output
    unknown = runner.invoke(app, ["explain", "rmsnorm", "--feature", "flying"])
    assert unknown.exit_code != 0 and "unknown feature 'flying'" in unknown.output


def _problem(*args: str) -> dict[str, object]:
    result = runner.invoke(app, ["explain", *args, "--json"])
    assert result.exit_code == 0, result.output
    problem: dict[str, object] = json.loads(result.stdout)["problem"]
    return problem


def test_explain_zero_tokens_is_an_empty_call_not_the_default_size() -> None:
    p = _problem("attention", "--tokens", "0")
    assert (p["tokens"], p["tokens_k"], p["max_seqlen_q"], p["max_seqlen_k"]) == (0, 0, 0, 0)
    assert _problem("rmsnorm", "--tokens", "0")["tokens"] == 0


@pytest.mark.parametrize(("tokens", "segments"), [(2, 3), (10, 3), (8192, 2), (1, 1)])
def test_explain_segments_and_tokens_describe_one_consistent_layout(tokens: int, segments: int) -> None:
    """Keys lay out like the queries unless --max-seqlen-k is given (``--segments 3 --tokens 2`` once
    described 2 query tokens against 6 key tokens)."""
    p = _problem("attention", "--tokens", str(tokens), "--segments", str(segments))
    mq = p["max_seqlen_q"]
    assert isinstance(mq, int) and p["num_segments"] == segments
    assert p["tokens"] == p["tokens_k"] == tokens and p["max_seqlen_k"] == mq
    assert mq <= tokens <= mq * segments  # segments of at most mq tokens that add up to tokens
    k = _problem("attention", "--tokens", str(tokens), "--segments", str(segments), "--max-seqlen-k", "64")
    assert k["tokens_k"] == 64 * segments and k["tokens"] == tokens


def test_explain_on_a_device_this_host_lacks_says_so_the_same_way_for_every_op() -> None:
    """``explain rmsnorm --device cuda`` on a host without CUDA once chose torch_native, while attention
    rejected torch_varlen as needing a CUDA device: every torch-native and Triton provider now gives the
    same reason, every op falls to the reference, and the table says why."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    reasons: dict[tuple[str, str], list[dict[str, object]]] = {}
    for op in ("attention", "moe_route", "moe_experts", "rmsnorm"):
        result = runner.invoke(app, ["explain", op, "--device", "cuda", "--json"])
        data = json.loads(result.stdout)
        assert result.exit_code == 0 and data["chosen"] == "reference", (op, data["chosen"])
        for c in data["candidates"]:
            reasons[(op, c["provider"])] = [
                {k: r[k] for k in ("code", "field", "expected", "actual")} for r in c["reasons"]
            ]
    absent = [{"code": "unavailable", "field": "cuda", "expected": "a CUDA device", "actual": "none visible"}]
    assert reasons[("attention", "torch_varlen")] == reasons[("rmsnorm", "torch_native")] == absent
    for key in [("rmsnorm", "triton"), ("moe_route", "triton"), ("moe_experts", "triton")]:
        if key in reasons:  # magi2-backend-triton installed
            assert reasons[key] == absent, key
    text = runner.invoke(app, ["explain", "rmsnorm", "--device", "cuda"]).stdout
    assert "note: there is no cuda device on this host" in text


def test_check_failure_hint_reruns_that_case_alone_and_piped_output_has_a_line_per_provider() -> None:
    """A failing case prints the ``magi2 check`` command that reruns it (it once printed pytest's ``-k``,
    which ``magi2 check`` did not accept), and piped output (a CI log, nox) says as each provider's cases
    finish what passed: it once printed nothing for minutes, then everything at the end."""
    import re

    import bad_provider.plugin as bad_plugin

    import magi2_core as m2

    m2.get_registry().register(bad_plugin, name="bad_example")
    try:
        result = runner.invoke(
            app,
            [
                "check",
                "--provider",
                "bad_attention",
                "--provider",
                "reference",
                "--op",
                "attention",
                "--seed",
                "3",
                "--max-tokens",
                "64",
            ],
        )
        assert result.exit_code == 1, result.output
        lines = result.stdout.splitlines()
        done = [line for line in lines if re.match(r"attention\[(bad_attention|reference)\] on cpu: \d+ passed", line)]
        assert len(done) == 2 and lines.index(done[0]) < lines.index(done[1]), result.stdout[:3000]
        assert any(line.startswith("FAILED attention[bad_attention]-cpu-") for line in lines)
        rerun = re.search(r'reproduce: magi2 check --seed 3 -k "([^"]+)"', result.stdout)
        assert rerun is not None, result.stdout[-3000:]
        again = runner.invoke(app, ["check", "--seed", "3", "-k", rerun.group(1).upper()])
        assert again.exit_code == 1, again.output
        assert "attention[bad_attention] on cpu: 0 passed, 1 failed" in again.stdout
        assert "1 failed" in again.stdout.splitlines()[-1]
        none = runner.invoke(app, ["check", "-k", "no-such-case"])
        assert none.exit_code == 2 and "no case id contains 'no-such-case'" in none.stderr
    finally:
        m2.get_registry().unregister("bad_example")


def test_backends_lists_features_only_for_the_ops_they_belong_to() -> None:
    from magi2_core.model.problem import OP_FEATURES

    data = json.loads(runner.invoke(app, ["backends", "--json"]).stdout)
    ref = next(b for b in data["backends"] if b["entry_point"] == "reference")
    for p in ref["providers"]:
        assert set(p["features"]) <= {f.value for f in OP_FEATURES[p["op"]]}, p
    table = runner.invoke(app, ["backends"]).stdout  # piped: one provider a line
    for line in table.splitlines():
        if line.split()[:1] in (["attention"], ["rmsnorm"], ["moe_experts"]):
            assert "route_" not in line, line
    assert any(line.startswith("moe_route ") and "route_softmax" in line for line in table.splitlines())


def test_backends_hides_a_feature_a_descriptor_declares_for_another_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """A third-party descriptor may declare every feature; the table shows those of its op alone."""
    from magi2_core.backend import Feature
    from magi2_core.selection.registry import get_registry

    real = get_registry().backends()
    ref = next(b for b in real if b.entry_point == "reference")
    every = [c.model_copy(update={"features": frozenset(Feature)}) for c in ref.spec.providers]
    fake = ref.__class__(**{**vars(ref), "spec": ref.spec.model_copy(update={"providers": tuple(every)})})
    monkeypatch.setattr(type(get_registry()), "backends", lambda self: [fake])
    text = runner.invoke(app, ["backends"]).stdout
    rows = [line for line in text.splitlines() if line.startswith(("attention ", "rmsnorm "))]
    assert rows and not any("route_" in row for row in rows), text


def test_check_list_prints_case_ids_without_running_them() -> None:
    listed = runner.invoke(app, ["check", "--op", "rmsnorm", "--provider", "reference", "--list"])
    assert listed.exit_code == 0, listed.output
    ids = listed.stdout.split()
    assert ids and all(i.startswith("rmsnorm[reference]-cpu-") for i in ids), ids
    assert "passed" not in listed.stdout  # nothing ran: no summary
    some = runner.invoke(app, ["check", "--op", "rmsnorm", "--provider", "reference", "--list", "-k", "flat"])
    assert some.exit_code == 0 and set(some.stdout.split()) == {i for i in ids if "flat" in i.lower()}
    assert (
        json.loads(
            runner.invoke(app, ["check", "--op", "rmsnorm", "--provider", "reference", "--list", "--json"]).stdout
        )
        == ids
    )


def test_explain_on_a_cpu_gives_advice_a_cpu_user_can_follow() -> None:
    cpu = " ".join(runner.invoke(app, ["explain", "rmsnorm", "--device", "cpu"]).stdout.split())
    assert "nothing to tune on a CPU" in cpu and "run `magi2 tune` to measure this machine" not in cpu
    gpu = " ".join(runner.invoke(app, ["explain", "rmsnorm", "--device", "cuda"]).stdout.split())
    assert "`magi2 tune` on a machine with this cuda device measures it" in gpu
