"""What each described device selects, compared with a committed record: any change to it is seen.

For described devices (the H200, the H100, the H20, an unknown CUDA 10.0 device, a MUSA device, the
CPU) under each profile they may run with (as chosen, ``generic``, a shipped name, a tuned file given
in place of ``MAGI2_PROFILE`` or set as ``MAGI2_PROFILE``), the record holds:

* for a grid of ``moe_experts`` calls (token counts that cross every plan row's boundary, 1, 3 and 12
  heads, three dtypes, deterministic or not), the plan the Triton MoE resolves to (variant, tile,
  alignment) and its ``why``, the text that names the rows and their provenance; off the interpreter
  (as on that device) and, for the CPU, through it;
* for the calls of ``magi2 tune``'s default grid, the plans ``magi2 tune`` would time (the plan's
  candidates);
* for attention, ``moe_route`` and ``rmsnorm`` calls of the default grid, the provider chosen.

A change of selection must be deliberate: regenerate the record with
``python tests/test_selection_snapshot.py --regenerate`` and commit it with the change that explains it.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")

RECORD = Path(__file__).with_name("data") / "selection_snapshot.json"

DEVICES: dict[str, dict[str, Any]] = {
    "h200": {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0"},
    "h100": {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "capability": "9.0"},
    "h20": {"type": "cuda", "name": "NVIDIA H20", "capability": "9.0"},
    "cuda-10.0": {"type": "cuda", "name": "NVIDIA Future GPU", "capability": "10.0"},
    "cuda-unknown": {"type": "cuda"},
    "musa": {"type": "musa", "name": "MTT S5000"},
    "cpu": {"type": "cpu"},
}
# A tuned profile of the H200 with preference rows and plan rows (one malformed, one of another provider).
TUNED: dict[str, Any] = {
    "format": "magi2-profile",
    "version": 1,
    "name": "tuned-nvidia-h200",
    "device": {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0"},
    "provenance": {"kind": "tune", "source": "magi2 tune on cuda NVIDIA H200", "date": "2026-12-06"},
    "preferences": [
        {
            "op": "rmsnorm",
            "id": "tune-norm",
            "prefer": ["reference"],
            "why": "measured fastest here",
            "when": [{"field": "tokens", "op": "le", "value": 20000}],
        },
        {
            "op": "attention",
            "id": "tune-attention",
            "prefer": ["torch_varlen"],
            "why": "measured fastest here",
            "when": [{"field": "max_seqlen_q", "op": "le", "value": 1024}],
        },
    ],
    "plans": [
        {
            "op": "moe_experts",
            "provider": "triton",
            "id": "tune-1",
            "when": [
                {"field": "dtype", "op": "eq", "value": "bfloat16"},
                {"field": "routes_per_expert", "op": "le", "value": 100},
            ],
            "plan": {
                "variant": "two_kernel",
                "align": "atomic",
                "tile": {
                    "BLOCK_M": 32,
                    "BLOCK_N1": 64,
                    "BLOCK_K1": 32,
                    "num_warps1": 4,
                    "num_stages1": 2,
                    "GROUP_M1": 8,
                    "BLOCK_N2": 64,
                    "BLOCK_K2": 32,
                    "num_warps2": 4,
                    "num_stages2": 2,
                    "GROUP_M2": 8,
                    "PACKED_W13": 1,
                },
            },
            "why": "measured fastest here",
        },
        {
            "op": "moe_experts",
            "provider": "triton",
            "id": "broken",
            "plan": {"variant": "two_kernel", "tile": {"BLOCK_M": 32}, "align": "atomic"},
            "why": "hand-edited",
        },
        {"op": "moe_experts", "provider": "other", "plan": {"x": 1}, "why": "another provider's row"},
    ],
}
TUNED_PATH = "<tuned file>"  # the temporary file's path, as the record writes it
# Token counts that cross every boundary of the shipped rows (routes per expert 16, 64, 128, 256 at 256
# experts and top-6), and the ends of the range.
TOKENS = (
    1,
    2,
    29,
    170,
    171,
    172,
    341,
    342,
    343,
    512,
    682,
    683,
    684,
    1365,
    1366,
    1367,
    2048,
    2730,
    2731,
    2732,
    4096,
    5461,
    5462,
    5463,
    8192,
    10922,
    10923,
    10924,
    14601,
    16384,
    20000,
)


def _profiles(device: str) -> list[str | None]:
    out: list[str | None] = [None, "generic", "env:tuned", "given:tuned"]
    if DEVICES[device]["type"] == "cuda":
        out += ["nvidia-h200", "nvidia-h100"]
    return out


def _experts(
    device_type: str, tokens: int, heads: int, dtype: str, det: bool, hidden: int = 256, intermediate: int = 1280
) -> Any:
    from magi2_core.model.problem import Feature, Problem

    return Problem(
        op="moe_experts",
        device_type=device_type,
        dtype=dtype,
        tokens=tokens,
        num_heads=heads,
        num_experts=256,
        top_k=6,
        hidden=hidden,
        intermediate=intermediate,
        features=frozenset({Feature.DETERMINISTIC} if det else ()),
    )


def _plan(plan: Any) -> list[Any]:
    return [plan.variant, dict(sorted(plan.tile.items())), plan.align]


@contextmanager
def _as_on_device(interpreting: bool) -> Iterator[None]:
    """Decide as on the device (no interpreter, this Triton's Gluon and descriptors) or through the interpreter."""
    from magi2_backend_triton.moe import gluon, tma
    from magi2_backend_triton.moe import plan as mp

    saved = (mp.interpreting, gluon._interpreting, tma._interpreting, gluon.gluon_import_error, tma._HAS_DESCRIPTORS)
    mp.interpreting = gluon._interpreting = tma._interpreting = lambda: interpreting  # type: ignore[assignment]
    gluon.gluon_import_error = lambda: None  # type: ignore[assignment]
    tma._HAS_DESCRIPTORS = True
    try:
        yield
    finally:
        mp.interpreting, gluon._interpreting, tma._interpreting, gluon.gluon_import_error, tma._HAS_DESCRIPTORS = saved


@contextmanager
def _profile(which: str | None, tuned: str, device: dict[str, Any]) -> Iterator[Any]:
    """The described device under ``which`` (see :func:`_profiles`)."""
    import magi2_core as m2
    from magi2_core.model.virtual_device import VirtualDevice

    saved = os.environ.pop("MAGI2_PROFILE", None)
    given = None
    if which == "env:tuned":
        os.environ["MAGI2_PROFILE"] = tuned
    elif which == "given:tuned":
        given = tuned
    elif which is not None:
        given = which
    m2.reload_config()
    try:
        yield VirtualDevice(**device, profile=given)
    finally:
        os.environ.pop("MAGI2_PROFILE", None)
        if saved is not None:
            os.environ["MAGI2_PROFILE"] = saved
        m2.reload_config()


def _others(device_type: str) -> list[Any]:
    """The attention, moe_route and rmsnorm calls of `magi2 tune`'s default grid, as problems."""
    from magi2_core.model.problem import Feature, Problem
    from magi2_core.tuning.grid import AttentionShape, NormShape, RouteShape, default_grid

    out = []
    for shape in default_grid():
        if isinstance(shape, AttentionShape):
            feats = {Feature.SINKS} if shape.sinks else set()
            feats |= {Feature.DETERMINISTIC} if shape.deterministic else set()
            kv = shape.heads_kv or shape.heads_q
            feats |= {Feature.GQA} if kv != shape.heads_q else set()
            total = sum(shape.lengths)
            out.append(
                Problem(
                    op="attention",
                    device_type=device_type,
                    dtype=shape.dtype,
                    tokens=total,
                    tokens_k=total,
                    max_seqlen_q=max(shape.lengths),
                    max_seqlen_k=max(shape.lengths),
                    num_segments=len(shape.lengths),
                    head_dim=shape.head_dim,
                    num_heads_q=shape.heads_q,
                    num_heads_kv=kv,
                    features=frozenset(feats),
                )
            )
        elif isinstance(shape, RouteShape):
            out.append(
                Problem(
                    op="moe_route",
                    device_type=device_type,
                    dtype=shape.dtype,
                    tokens=shape.tokens,
                    num_heads=shape.heads,
                    num_experts=shape.experts,
                    top_k=shape.top_k,
                    hidden=shape.hidden,
                )
            )
        elif isinstance(shape, NormShape):
            out.append(
                Problem(
                    op="rmsnorm",
                    device_type=device_type,
                    dtype=shape.dtype,
                    tokens=shape.shape[0],
                    width=shape.shape[-1],
                    num_modalities=len(shape.modality_sizes or (0,)),
                    out_dtype=shape.out_dtype,
                )
            )
    return out


def _tune_experts(device_type: str) -> list[Any]:
    from magi2_core.model.problem import Feature, Problem
    from magi2_core.tuning.grid import ExpertsShape, default_grid

    return [
        Problem(
            op="moe_experts",
            device_type=device_type,
            dtype=s.dtype,
            tokens=s.tokens,
            num_heads=s.heads,
            num_experts=s.experts,
            top_k=s.top_k,
            hidden=s.hidden,
            intermediate=s.intermediate,
            features=frozenset({Feature.DETERMINISTIC} if s.deterministic else ()),
        )
        for s in default_grid()
        if isinstance(s, ExpertsShape)
    ]


def record(tuned: str) -> dict[str, Any]:
    """The selections of every device under every profile (``tuned``: the tuned profile file's path)."""
    from magi2_backend_triton.moe import plan as mp
    from magi2_backend_triton.providers import triton_moe_experts

    from magi2_core.errors import NoEligibleProviderError
    from magi2_core.selection.registry import Registry
    from magi2_core.selection.resolver import resolve_problem

    whys: list[str] = []
    plans: list[list[Any]] = []

    def why(text: str) -> int:
        return _index(whys, text.replace(tuned, TUNED_PATH))

    registry = Registry()
    out: dict[str, Any] = {}
    for label, device in DEVICES.items():
        for which in _profiles(label):
            entry: dict[str, Any] = {}
            with _profile(which, tuned, device) as vd:
                modes = (False, True) if vd.type == "cpu" else (False,)
                for interp in modes:
                    chosen_plans: dict[str, list[list[int]]] = {}
                    with _as_on_device(interp):
                        for d, i in ((256, 1280), (192, 1280)):
                            for dtype in ("bfloat16", "float16", "float32"):
                                for det in (False, True):
                                    for heads in (1, 3, 12):
                                        # [plan, why, how many token counts of TOKENS in a row have them]
                                        chosen_plans[f"d{d} I{i} {dtype} H{heads}{' det' if det else ''}"] = _runs(
                                            [_index(plans, _plan(p)), why(p.why)]
                                            for p in (
                                                triton_moe_experts.plan_on(
                                                    _experts(vd.type, t, heads, dtype, det, d, i), vd
                                                )
                                                for t in TOKENS
                                            )
                                        )
                        dev = mp.described_id(vd)
                        rows, source = mp.rows_for(dev, vd.profile)
                        cands = {
                            f"T{p.tokens} H{p.num_heads}{' det' if _deterministic(p) else ''}": [
                                [_index(plans, _plan(c)), why(c.why)] for c in mp.candidates_for(p, dev, rows, source)
                            ]
                            for p in _tune_experts(vd.type)
                        }
                    entry["interpreter" if interp else "device"] = {"plans": chosen_plans, "tune_candidates": cands}
                chosen = []
                for problem in _others(vd.type):
                    try:
                        res = resolve_problem(problem, registry=registry, device=vd).chosen
                    except NoEligibleProviderError:
                        res = None
                    chosen.append(
                        [
                            problem.op,
                            problem.tokens,
                            problem.max_seqlen_q,
                            sorted(problem.features),
                            problem.out_dtype,
                            problem.num_heads,
                            res,
                        ]
                    )
                entry["providers"] = chosen
            out[f"{label} / {which or 'as chosen'}"] = entry
    return {"tokens": list(TOKENS), "plans": plans, "whys": whys, "selections": out}


def _runs(items: Iterable[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for item in items:
        if out and out[-1][:-1] == item:
            out[-1][-1] += 1
        else:
            out.append([*item, 1])
    return out


def _index(table: list[Any], item: Any) -> int:
    if item not in table:
        table.append(item)
    return table.index(item)


def _deterministic(problem: Any) -> bool:
    from magi2_core.model.problem import Feature

    return Feature.DETERMINISTIC in problem.features


def _run(tmp: Path) -> dict[str, Any]:
    path = tmp / "tuned.json"
    path.write_text(json.dumps(TUNED))
    saved = {k: os.environ.get(k) for k in ("TRITON_INTERPRET", "XDG_CACHE_HOME")}
    os.environ["TRITON_INTERPRET"] = "1"  # the registry loads Triton's providers for the CPU too
    os.environ["XDG_CACHE_HOME"] = str(tmp / "cache")  # no user profiles
    try:
        return record(str(path))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_selection_matches_the_record(tmp_path: Path) -> None:
    got = _run(tmp_path)
    want = json.loads(RECORD.read_text())
    assert got["plans"] == want["plans"]
    assert got["whys"] == want["whys"]
    for key in want["selections"]:
        assert got["selections"].get(key) == want["selections"][key], key
    assert got == want


if __name__ == "__main__":
    import tempfile

    logging.disable(logging.WARNING)  # the tuned profile's malformed row is reported on every read
    if sys.argv[1:] != ["--regenerate"]:
        sys.exit("usage: python tests/test_selection_snapshot.py --regenerate  (writes " + str(RECORD) + ")")
    with tempfile.TemporaryDirectory() as tmp:
        data = _run(Path(tmp))
    RECORD.parent.mkdir(exist_ok=True)
    lines = [f" {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in data.items()]
    RECORD.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    print(f"wrote {RECORD}")
