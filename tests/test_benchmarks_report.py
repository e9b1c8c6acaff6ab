"""README's headline table and docs/benchmarks.md are generated from benchmarks/results/*.json and must
not drift from them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from benchmarks import report


def test_readme_table_equals_the_table_generated_from_the_json() -> None:
    data, _ = report.load()
    assert report.readme_table() == report.headline_table(data), "run: python -m benchmarks.report"
    assert report.main(["--check"]) == 0


def test_the_headline_table_fits_the_readme() -> None:
    data, _ = report.load()
    lines = report.headline_table(data).splitlines()
    assert 2 < len(lines) <= 2 + report.HEADLINE_ROWS
    assert max(len(line) for line in lines) <= report.HEADLINE_WIDTH
    assert [r.split(" | ")[0] for r in lines[2:]] == [
        "| MoE experts, T = 14601, 3 x 256 experts, top-6",
        "| attention + sink, 14601x2, 24 x 128",
        "| RMSNorm, 65536 x 3072, 3 modalities",
        "| vllm-omni layer, T = 14601, eager / compiled",
        "| dispatch added per call, inputs on the GPU",
        "| whole DiT step (forward), eager / compiled",
    ]


def _dit(mode: str, plugin: bool, p50: float) -> dict[str, object]:
    return {"mode": mode, "plugin": plugin, "form": "t2v 480p", "s_per_step": {"p50": p50, "p90": p50}}


def test_a_whole_dit_step_file_adds_its_row_and_none_is_skipped(tmp_path: Path) -> None:
    """dit_step_<device>.json (records of mode, plugin, form, s_per_step) gives one headline row and
    rows in the full table; without such a file the table is what it was."""
    data, _ = report.load()
    data = {name: d for name, d in data.items() if not name.startswith(report.DIT_STEP)}
    assert "whole DiT step" not in report.headline_table(data)
    records = [
        _dit("eager", True, 1.0),
        _dit("eager", False, 2.5),
        _dit("compiled", True, 0.8),
        _dit("compiled", False, 1.6),
    ]
    (tmp_path / "dit_step_h200.json").write_text(json.dumps({"device": "NVIDIA H200", "records": records}))
    dit, notes = report.load(tmp_path)
    assert set(dit) == {"dit_step_h200.json"} and not notes
    table = report.headline_table({**data, **dit}).splitlines()
    assert table[-1] == (
        "| whole DiT step (t2v 480p), eager / compiled | 2.50x / 2.00x | plugin off 2.500 / 1.600 s | H200 |"
    )
    full = report.results_table(dit)
    assert "plugin on 1.000 / 0.800 s per step" in full and "speed-up 2.50x / 2.00x" in full
    listed = report.results_table({"dit_step_h200.json": records})  # a bare list of records works too
    assert "speed-up 2.50x / 2.00x" in listed
    assert "matmul floor" not in full  # the file measured no ceilings


def test_a_dit_step_file_with_its_ceilings_sets_the_fastest_step_beside_its_floor() -> None:
    records = [_dit("eager", True, 1.0), _dit("eager", False, 2.5), _dit("graph", True, 0.8), _dit("graph", False, 1.6)]
    d = {
        "device": "NVIDIA H200",
        "git_commit": "abcdef0123",
        "records": records,
        "ceilings": {"copy_tb_s": 4.0, "matmul_tflops": 700.0, "how": "-"},
        "matmul_floor_s": 0.6,
    }
    full = report.results_table({"dit_step_h200.json": d})
    assert (
        "| whole DiT step against its BF16 matmul floor | graph | plugin on 0.800 s per step | floor 0.600 s (its BF16 "
        "products at 700 TFLOP/s, measured) | floor / step 0.75; NVIDIA H200, abcdef0 (`dit_step_h200.json`) |"
    ) in full


def test_every_committed_results_file_is_summarised_or_explained() -> None:
    data, notes = report.load()
    names = {p.name for p in report.RESULTS.glob("*.json")}
    explained = {n.split("`")[1] for n in notes}
    assert names == set(data) | explained
    assert not [n for n in notes if "no summariser" in n], notes


def test_unknown_and_broken_files_are_skipped_with_a_note(tmp_path: Path) -> None:
    shutil.copy(report.RESULTS / "dispatch_cpu.json", tmp_path)
    (tmp_path / "fa4_h200.json").write_text(json.dumps({"benchmark": "new"}))
    data, notes = report.load(tmp_path)
    assert set(data) == {"dispatch_cpu.json"}
    assert notes == ["`fa4_h200.json`: skipped, no summariser in benchmarks/report.py yet"]


def test_a_changed_schema_gives_a_row_that_says_so_not_a_crash() -> None:
    table = report.results_table({report.MOE_BENCH: {"shape": {}}})
    assert "not summarised: KeyError" in table and report.MOE_BENCH in table


def test_check_fails_when_the_readme_table_is_stale(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.BEGIN}\n| stale |\n{report.END}\nrest\n")
    data, _ = report.load()
    assert report.readme_table(readme) != report.results_table(data)
    report.write_readme(report.results_table(data), readme)
    assert report.readme_table(readme) == report.results_table(data)
    assert readme.read_text().startswith("intro\n") and readme.read_text().endswith("\nrest\n")


def _moe_file(device: str, **extra: object) -> dict[str, object]:
    """A `benchmarks/moe.py` file (the schema since the warp-specialised kernel) with one shape: 4096 x 3 heads."""

    def st(p50: float) -> dict[str, float]:
        return {"p50": p50, "p10": p50, "p90": p50}

    bench = {
        "tokens": 4096,
        "heads": 3,
        "fused": st(0.46),
        "fused_graph": st(0.44),
        "previous": st(0.51),
        "previous_graph": st(0.49),
        "native": st(3.4),
        "fused_eager_over_graph": 0.46 / 0.44,
        "fused_rel_l2": 2.5e-4,
        "tiles": {"variant": "gluon_ws"},
        "graph_errors": {},
        "flops": 0.5 * 679e12 * 0.44e-3,
        "weight_bytes": 0.25 * 4.27e12 * 0.44e-3,  # 0.5 / 0.25 on the H200
    }
    return {
        "shape": {"E": 256, "K": 6, "d": 256, "I": 1280},
        "device": device,
        "commit": "0123456789",
        "bench": [bench],
        **extra,
    }


def test_moe_bench_rows_read_the_eager_and_graph_schema() -> None:
    # one row per head count, then the targets (the H200's, judged on its files)
    [(op, shape, ours, base, notes), target] = report.moe_bench_rows(_moe_file("NVIDIA H200"))
    assert target[2] == "0.440 ms" and target[4].startswith("all met")  # 4096 x 3 heads: <= 0.45
    assert "gluon_ws" in op and "T = 4096" in shape
    assert ours == "graph 0.440 ms; eager 0.460 ms"
    assert "graph 0.490" in base and "eager 3.400" in base and "graph -" in base  # no native graph: a dash
    assert "graph at 0.50 of the matmul ceiling, 0.25 of the weight floor" in notes
    assert "eager / graph 1.05" in notes and "0123456" in notes
    # another device's file without ceilings: no fractions and no (H200) targets; the code that ran
    other = _moe_file("NVIDIA H100 80GB HBM3", git_commit="abcdef0")
    [(_, _, _, _, notes)] = report.moe_bench_rows(other)
    assert "matmul ceiling" not in notes and report.NO_CEILINGS in notes
    assert "abcdef0" in notes and "0123456" not in notes


def test_a_file_with_recorded_ceilings_gets_its_fractions_from_them() -> None:
    """The general rule: recorded ceilings (measured in the file's run) > the H200's constants for an older
    H200 file > none; the H200's constants are never used for another device."""
    h100 = {"copy_tb_s": 2.135, "matmul_tflops": 339.5, "how": "measured"}  # half the H200's: twice the fractions
    [(_, _, _, _, notes)] = report.moe_bench_rows(_moe_file("NVIDIA H100 80GB HBM3", ceilings=h100))
    assert "graph at 1.00 of the matmul ceiling, 0.50 of the weight floor" in notes
    # recorded ceilings win over the H200's constants on an H200 file too
    [(_, _, _, _, notes), _] = report.moe_bench_rows(_moe_file("NVIDIA H200", ceilings=h100))
    assert "graph at 1.00 of the matmul ceiling" in notes
    assert report.file_ceilings({"device": "NVIDIA H200"}) == report.FileCeilings(4.27, 679.0)
    assert report.file_ceilings({"env": {"device": "NVIDIA H100 80GB HBM3"}}) is None
    assert report.file_ceilings({"env": {"device": "NVIDIA H100 80GB HBM3", "ceilings": h100}}) == report.FileCeilings(
        2.135, 339.5
    )
    # the first mHC files measured their copy in the run, before "ceilings" were recorded
    mhc = {"env": {"device": "NVIDIA H100 80GB HBM3", "copy_tb_s_measured": 3.0}}
    assert report.file_ceilings(mhc) == report.FileCeilings(3.0, None)
    # a distributed file's "env" holds its NCCL settings, its ceilings sit beside its device
    assert report.file_ceilings(
        {"device": "NVIDIA H100 80GB HBM3", "env": {"NCCL_NVLS_ENABLE": "0"}, "ceilings": h100}
    ) == report.FileCeilings(2.135, 339.5)


def test_rmsnorm_rows_divide_by_the_files_copy_or_give_none() -> None:
    row = {
        "name": "x",
        "shape": [8, 16],
        "dtype": "torch.bfloat16",
        "out_dtype": "torch.bfloat16",
        "modality_sizes": None,
        "output_equals_fp32_cast": True,
        "results": {k: {"tb_s": 2.4} for k in ("fused_triton", "composite_eager", "composite_compiled")},
    }
    old_h200 = {"env": {"device": "NVIDIA H200", "copy_ceiling_tb_s_reference": 4.27}, "rows": [row]}
    assert report.rmsnorm_rows(old_h200)[0][2] == f"2.40 TB/s ({2.4 / 4.27:.2f} of copy)"
    h100 = {
        "env": {"device": "NVIDIA H100 80GB HBM3", "ceilings": {"copy_tb_s": 3.0, "matmul_tflops": 600.0}},
        "rows": [row],
    }
    assert report.rmsnorm_rows(h100)[0][2] == "2.40 TB/s (0.80 of copy)"
    bare = {"env": {"device": "NVIDIA H100 80GB HBM3"}, "rows": [row]}
    assert report.rmsnorm_rows(bare)[0][2] == f"2.40 TB/s ({report.NO_CEILINGS})"


def test_the_readme_table_holds_one_current_verdict_per_target_and_no_history() -> None:
    """Old "targets NOT met" rows of earlier sweeps once sat beside the current ones: the README keeps the
    newest run's verdict, docs/benchmarks.md the earlier runs (without verdicts), CHANGELOG.md the story."""
    data, _ = report.load()
    rows = report.results_table(data).splitlines()[2:]
    (targets,) = [r for r in rows if r.startswith("| MoE speed targets")]
    assert targets.endswith(f"(`{report.MOE_BENCH}`) |")
    assert len([r for r in rows if "target <= 5 us added" in r]) == 1  # judged on the serving path only
    assert not [r for r in rows if any(f"`{name}`" in r for name in report.HISTORY)]
    history = report.results_table(data, history=True)
    assert all(f"`{name}`" in history for name in report.HISTORY if name in data)
    assert "targets" not in history and "target <=" not in history
