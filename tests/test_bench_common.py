"""The shared benchmark statistics and CPU timing (benchmarks/_common.py)."""

from __future__ import annotations

import math

import pytest

from benchmarks._common import env_record, percentile, stats, time_alternating, time_loop


def test_nearest_rank_percentiles_stay_within_the_samples() -> None:
    s = stats([1.0, 4.0, 2.0, 3.0])
    assert (s["p10"], s["p50"], s["p90"]) == (1.0, 2.0, 4.0)  # ranks ceil(0.4)=1, ceil(2)=2, ceil(3.6)=4
    assert (s["min"], s["max"], s["mean"], s["n"]) == (1.0, 4.0, 2.5, 4)
    one = stats([0.25])
    assert one["p10"] == one["p50"] == one["p90"] == 0.25


@pytest.mark.parametrize("n", [2, 3, 5, 10, 11, 31])
def test_every_percentile_is_a_sample(n: int) -> None:
    samples = [1.0 + (i * 7919 % 13) / 3 for i in range(n)]
    s = stats(samples)
    for key in ("p10", "p50", "p90", "min", "max"):
        assert s[key] in samples
    assert s["p10"] <= s["p50"] <= s["p90"]
    assert percentile(sorted(samples), 100) == max(samples) and percentile(sorted(samples), 0) == min(samples)


@pytest.mark.parametrize("bad", [[], [1.0, math.nan], [1.0, math.inf], [0.0, 1.0], [2.0, -1.0]],
                         ids=["empty", "nan", "inf", "zero", "negative"])
def test_bad_times_are_errors(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="stats"):
        stats(bad)


def test_cpu_timing_and_environment_record() -> None:
    calls = {"a": 0, "b": 0}

    def bump(name: str) -> None:
        calls[name] += 1
        sum(range(2000))

    fns = {"a": lambda: bump("a"), "b": lambda: bump("b")}
    out = time_alternating(fns, 5, warmup=2, device="cpu")
    assert calls == {"a": 7, "b": 7} and all(len(v) == 5 for v in out.values())
    assert stats(out["a"])["p50"] > 0
    loop = time_loop(fns, 3, 4, device="cpu")
    assert calls == {"a": 19, "b": 19} and all(len(v) == 3 for v in loop.values())
    rec = env_record("cpu")
    assert rec["device"] == "cpu" and rec["torch"] and rec["git_commit"] and rec["date_utc"].endswith("+00:00")
