"""The shared benchmark statistics, CPU timing and device ceilings (benchmarks/_common.py)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from benchmarks import _common
from benchmarks._common import env_record, percentile, stats, time_alternating, time_loop
from magi2_core.tools.timing import Reading

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


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


@pytest.mark.parametrize(
    "bad",
    [[], [1.0, math.nan], [1.0, math.inf], [0.0, 1.0], [2.0, -1.0]],
    ids=["empty", "nan", "inf", "zero", "negative"],
)
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


class FixedTimer:
    """Every call takes ``ms`` milliseconds (a stand-in for device events)."""

    def __init__(self, ms: float) -> None:
        self.ms, self.calls = ms, 0

    def time(self, label: str, fn: Callable[[], object]) -> Reading:
        fn()
        self.calls += 1
        return lambda: self.ms

    def synchronize(self) -> None:
        return None


def test_the_copy_and_matmul_rates_are_the_work_over_the_p50() -> None:
    timer = FixedTimer(2.0)
    assert _common.measure_copy_tbs(4096, 3, device="cpu", timer=timer) == 4096 / 2e-3 / 1e12
    assert _common.measure_matmul_tflops(32, 3, device="cpu", timer=timer) == 2 * 32**3 / 2e-3 / 1e12
    assert timer.calls == 6  # 3 timed calls each (the warm-up calls are not timed)


@pytest.fixture
def fresh_ceilings() -> Iterator[None]:
    _common.measure_ceilings.cache_clear()
    yield
    _common.measure_ceilings.cache_clear()


@pytest.mark.usefixtures("fresh_ceilings")
def test_the_ceilings_are_measured_once_per_process_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    measured: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(_common, "measure_copy_tbs", lambda device: measured.append(f"copy {device}") or 3.0)
    monkeypatch.setattr(_common, "measure_matmul_tflops", lambda device: measured.append(f"mm {device}") or 600.0)
    first = _common.measure_ceilings()
    assert _common.measure_ceilings() is first and measured == ["copy cuda", "mm cuda"]
    rec = first.record()
    assert (rec["copy_tb_s"], rec["matmul_tflops"]) == (3.0, 600.0)
    assert "copy" in str(rec["how"]) and "8192^3 BF16" in str(rec["how"]) and "p50" in str(rec["how"])


@pytest.mark.usefixtures("fresh_ceilings")
def test_the_ceilings_are_refused_without_a_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"'cpu' is not a CUDA device.*records no ceilings"):
        _common.measure_ceilings("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device here"):
        _common.measure_ceilings()


# A device ceiling written into a benchmark: a constant named for a rate, or one of the rates it has held
# (the H200's copy and matmul, the H100's nominal copy). The report's reading of older files is the one
# exception: its ``H200_CEILINGS`` line.
_CEILING_NAME = re.compile(
    r"^\s*([A-Z][A-Z0-9_]*(?:TBPS|TBS|TB_S|TFLOPS|CEILING)[A-Z0-9_]*)\s*(?::[^=\n]*)?=\s*[\d.]", re.MULTILINE
)
_CEILING_VALUE = re.compile(r"(?<![\w.])(?:4\.27|679(?:\.0)?|3\.35)(?![\w.])")
_LEGACY = "H200_CEILINGS = "


def _bare_ceilings(text: str) -> list[str]:
    return [m.group(1) for m in _CEILING_NAME.finditer(text)] + [m.group(0) for m in _CEILING_VALUE.finditer(text)]


def test_the_ceiling_scan_finds_what_it_looks_for() -> None:
    assert _bare_ceilings("COPY_TBPS = 4.27  # H200\nMATMUL_TFLOPS: float = 679.0\n") == [
        "COPY_TBPS",
        "MATMUL_TFLOPS",
        "4.27",
        "679.0",
    ]
    assert _bare_ceilings("docstring: the 679 TFLOP/s ceiling") == ["679"]
    assert _bare_ceilings("COPY_BYTES = 2 * 1024**3\nx = 14.27 + 6790\n") == []


@pytest.mark.parametrize("path", sorted(BENCHMARKS.glob("*.py")), ids=lambda p: p.name)
def test_no_benchmark_hard_codes_a_device_ceiling(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.name == "report.py":
        assert len([line for line in lines if line.startswith(_LEGACY)]) == 1
        lines = [line for line in lines if not line.startswith(_LEGACY)]
    found = _bare_ceilings("\n".join(lines))
    assert not found, f"{path.name}: device ceilings written in ({found}); use _common.measure_ceilings()"


def test_the_pack_counter_counts_the_banks_the_triton_backend_builds() -> None:
    pytest.importorskip("magi2_backend_triton")
    from magi2_backend_triton.providers import triton_moe_experts

    from benchmarks._common import pack_counter

    count = pack_counter()
    assert count is not None and pack_counter() is count  # installed once per process
    g = torch.Generator().manual_seed(1)
    wg, wu, wd = (
        torch.randn(4, 8, 16, generator=g),
        torch.randn(4, 8, 16, generator=g),
        torch.randn(4, 16, 8, generator=g),
    )
    before = count()
    triton_moe_experts.prepare_weights(wg, wu, wd)  # what m2.prepare_moe_weights calls where Triton serves
    assert count() == before + 1
