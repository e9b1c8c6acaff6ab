"""Where the Gluon fused-MoE kernel spends its time, by leaving pieces out (no hardware counters here).

Where no hardware counters can be read (Nsight Compute needs them, and some virtualised GPU hosts
refuse them), time is placed inside the kernel by differences: time the kernel with one piece of its work removed
(`benchmarks/_moe_gluon_ablation.py`: this benchmark's copy of `kernels_gluon.py` with ABLATE bits: 1 SwiGLU7's
arithmetic, 2 the gate/up MMAs, 4 the down MMAs, 8 the weight refills in the slice loop, 16 the loop itself, 32 the
activation gather, 64 the store) and take differences against the whole kernel, all in one run on the same inputs
and route buffers. Only the expert kernel is timed (no alignment, no top-k
sum), each variant captured in its own CUDA graph, replayed in rotation with L2 flushed; graph p50
and p10-p90. Outputs of ablated variants are wrong by construction and are not checked; the whole
kernel (ABLATE=0) is checked against the pointer kernel bit for bit.

    PYTHONPATH=backends/triton/src:backends/reference/src:. python -m benchmarks.moe_ablation
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import platform
from typing import Any

import torch
import triton

from benchmarks import _common
from benchmarks import moe as bm

# name -> ABLATE bits. "no down MMA" makes ptxas serialize the gate/up MMAs (a wait after each one in
# the SASS), so it is reported but not read as the down projection's share.
ABLATIONS = {
    "whole": 0,
    "no SwiGLU7 math": 1,
    "no gate/up MMA": 2,
    "no down MMA (serialized G1)": 4,
    "no weight refill": 8,
    "no refill, no SwiGLU7 math": 9,
    "no refill, no gate/up MMA": 10,
    "no MMAs, no SwiGLU7 math": 7,
    "no refill, no MMAs, no math": 15,
    "no gather": 32,
    "no output store": 64,
    "first and last slice only": 24,
    "first and last slice, no gather, no store": 24 | 32 | 64,
}
SHAPES = [(14601, 3), (4096, 3), (512, 3)]


def _launch_ablated(x: Any, w13: Any, w_down: Any, probs_flat: Any, routed: Any, bufs: Any, *, topk: int, tile: Any,
                    bits: int) -> None:
    """`gluon.launch_fused_gluon` with this benchmark's copy of the kernel and its ABLATE bits."""
    from magi2_backend_triton.moe import gluon

    from benchmarks import _moe_gluon_ablation as kernels

    w13_desc, wd_desc = gluon._descriptors(x, w13, w_down, tile)
    kernels.fused_expert_gluon_kernel[(bufs.capacity // tile.block_m,)](
        x, w13_desc, wd_desc, probs_flat, routed, bufs.sorted_ids, bufs.expert_ids, bufs.num_padded,
        x.shape[0], routed.shape[0], x.stride(0), x.stride(1),
        **gluon._meta(x, w13, topk, tile), ABLATE=bits, num_warps=tile.num_warps, launch_pdl=True,
    )  # fmt: skip


def ablate_shape(tokens: int, heads: int, iters: int, ceilings: _common.Ceilings) -> dict[str, Any]:
    from magi2_backend_triton.moe.fused import MoEState, call_problem, run_fused
    from magi2_backend_triton.moe.pack import pack_w13
    from magi2_backend_triton.moe.plan import choose_alignment, device_id
    from magi2_backend_triton.moe.tiles import launch_of
    from magi2_backend_triton.providers import triton_moe_experts

    x, probs, idx, wg, wu, wd = bm.make_inputs(tokens, heads, seed=9100 + tokens)
    bank = pack_w13(wg, wu)
    del wg, wu
    gate, up = bank[:, 0::2, :].transpose(1, 2), bank[:, 1::2, :].transpose(1, 2)
    plan = triton_moe_experts.plan(call_problem(x, idx, gate, False))
    assert plan.variant.startswith("gluon"), f"the plan is not a Gluon kernel here: {plan}"
    # the row-block kernel (the ablation bits are its own) with the plan's tile, and the pointer kernel
    align = choose_alignment(device_id("cuda", None), heads * bm.E, False)
    plan = plan.model_copy(update={"variant": "gluon", "align": align})
    tile = launch_of(plan).single
    assert tile is not None
    state = MoEState()
    run = run_fused(x, probs, idx, gate, up, wd, state=state, plan=plan)
    assert run.routed is not None and run.buffers is not None
    bufs, routed = run.buffers, run.routed
    pointer = run_fused(x, probs, idx, gate, up, wd, state=MoEState(),
                        plan=plan.model_copy(update={"variant": "pointer"}))
    assert pointer.routed is not None
    probs_flat = probs.reshape(-1).float()
    out: dict[str, Any] = {
        "tokens": tokens, "heads": heads, "tile": dataclasses.asdict(tile), "num_blocks": None,
        "whole_bit_equal_pointer": bool(torch.equal(routed, pointer.routed)),
        **bm.floors(tokens, heads, ceilings),
    }  # fmt: skip
    num_padded = int(bufs.num_padded.item())
    out["num_blocks"] = num_padded // tile.block_m
    out["executed_rows"] = num_padded
    fns = {}
    for name, bits in ABLATIONS.items():
        call = functools.partial(
            _launch_ablated, x, bank, wd, probs_flat, routed, bufs, topk=bm.K, tile=tile, bits=bits
        )
        call()
        torch.cuda.synchronize()
        fns[name] = _common.graphed(call)
    samples = bm.time_alternating(fns, iters)
    whole = None
    out["variants"] = {}
    for name, s in samples.items():
        st = bm.stats(s)
        if name == "whole":
            whole = st["p50"]
        out["variants"][name] = {"bits": ABLATIONS[name], "graph": st}
    assert whole is not None
    exec_flops = 6.0 * bm.D * bm.I * num_padded
    for rec in out["variants"].values():
        rec["saved_ms"] = whole - rec["graph"]["p50"]
        rec["saved_fraction"] = rec["saved_ms"] / whole
    out["whole_executed_tflops"] = exec_flops / (whole * 1e-3) / 1e12
    out["executed_flops"] = exec_flops
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/moe_ablation_h200.json")
    ap.add_argument("--iters", type=int, default=25)
    args = ap.parse_args()
    ceilings = _common.measure_ceilings()
    report: dict[str, Any] = {
        "benchmark": "moe_ablation",
        "device": torch.cuda.get_device_name(),
        "ceilings": ceilings.record(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "commit": _common.git_commit(),
        "method": ("graph p50 of the Gluon expert kernel alone, L2 flushed, variants rotating; "
                   "ablated outputs unchecked"),
        "shapes": [],
    }
    for tokens, heads in SHAPES:
        report["shapes"].append(ablate_shape(tokens, heads, args.iters, ceilings))
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    for r in report["shapes"]:
        print(f"\nT={r['tokens']} Hl={r['heads']} blocks={r['num_blocks']} whole bit-equal pointer: "
              f"{r['whole_bit_equal_pointer']}, executed {r['whole_executed_tflops']:.0f} TFLOP/s")  # fmt: skip
        for name, v in r["variants"].items():
            g = v["graph"]
            print(f"  {name:<32} {g['p50']:.3f} ms ({g['p10']:.3f}-{g['p90']:.3f})  saves {v['saved_ms']:+.3f} "
                  f"({100 * v['saved_fraction']:+.0f}%)")  # fmt: skip


if __name__ == "__main__":
    main()
