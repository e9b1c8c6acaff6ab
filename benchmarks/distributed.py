"""Scale-out layers on 2 GPUs: expert-parallel MoE (EP2) and Ulysses attention (Ulysses2) vs one GPU.

Production shapes (MAGI-2 at 272p): MoE 12 heads x d=256, E=256, top-6, I=1280, T_local=14601 tokens
per rank (29202 in all); attention 24 heads x 128, T=29202 as two 14601-token segments, one sink.
Each distributed call is split into its stages, timed per rank with device events:
``a2a_in`` (scatter heads / gather tokens), ``compute`` (the resolved local operators), ``a2a_out``
(the inverse all-to-all). The all-to-all stages include waiting for the slower rank, as in a real
step. The one-GPU baseline runs the whole layer (all heads, all tokens) on rank 0; EP and baseline
calls alternate, a 256 MiB buffer is zeroed before each call (L2 flush, outside the timed region),
and the ranks meet at a barrier before each EP call. Token counts are passed in (no size exchange
in the timed path). Correctness: every rank compares its EP output with the one-GPU output of the
same resolved providers (rel-L2, max |diff|, bit-equality). Each rank measures its GPU's ceilings first
(``_common.measure_ceilings``); the compute stage's fraction of the matmul ceiling divides by rank 0's,
recorded as the file's "ceilings" (every rank's under "ceilings_per_rank"; none on the CPU).

    # 2 GPUs (NCCL; NVLink multicast stays off):
    python -m benchmarks.distributed --out benchmarks/results/distributed_h200x2.json
    # CPU check of the script's logic (gloo, tiny shapes):
    python -m benchmarks.distributed --backend gloo --device cpu --tiny --out /tmp/distributed_tiny.json
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks._common import git_commit, measure_ceilings, stats

# NVLink multicast off: on a host whose GPUs other jobs share, a multicast fault can take them all down, so this
# benchmark never uses it (forced, not defaulted).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


@dataclass(frozen=True)
class Shapes:
    moe_heads: int
    d: int
    experts: int
    top_k: int
    inter: int
    tokens_local: int
    attn_heads: int
    head_dim: int
    segments: tuple[int, ...]


PRODUCTION = Shapes(12, 256, 256, 6, 1280, 14601, 24, 128, (14601, 14601))
TINY = Shapes(12, 16, 8, 2, 32, 24, 4, 16, (30, 18))


def ensure_backends() -> None:
    """Register in-tree backends that are importable but not pip-installed (no entry points)."""
    from magi2_core.selection.registry import get_registry

    reg = get_registry()
    for module, name, op, provider in (
        ("magi2_backend_reference.plugin", "reference", "attention", "reference"),
        ("magi2_backend_triton.plugin", "triton", "moe_experts", "triton"),
        ("magi2_backend_cuda_fa3.plugin", "cuda_fa3", "attention", "fa3"),
    ):
        if reg.provider(op, provider) is None:
            try:
                reg.register(importlib.import_module(module), name=name)
            except ImportError as exc:
                print(f"[bench] backend {name} not available: {exc}", flush=True)


class Clock:
    """Marks on the device timeline (CUDA events) or the host clock (CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.flush_buf = torch.empty(256 * 2**20, dtype=torch.uint8, device=device) if self.cuda else None

    def mark(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, a: Any, b: Any) -> float:
        return float(a.elapsed_time(b)) if self.cuda else (b - a) * 1e3

    def flush(self) -> None:
        if self.flush_buf is not None:
            self.flush_buf.zero_()


def staged(clock: Clock, stages: list[tuple[str, Callable[[Any], Any]]]) -> tuple[dict[str, float], Any]:
    """Run ``stages`` in order (each gets the previous result), marking between them; ms per stage."""
    marks = [clock.mark()]
    value: Any = None
    for _, fn in stages:
        value = fn(value)
        marks.append(clock.mark())
    clock.sync()
    return {name: clock.ms(marks[i], marks[i + 1]) for i, (name, _) in enumerate(stages)}, value


def summary(ms: list[float]) -> dict[str, float]:
    return stats(ms)


def compare(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    diff = a.float() - b.float()
    return {
        "rel_l2": float(diff.norm() / b.float().norm().clamp_min(1e-30)),
        "max_abs": float(diff.abs().max()),
        "bit_equal": bool(torch.equal(a, b)),
    }


def bench_moe(
    rank: int, world: int, s: Shapes, dev: torch.device, clock: Clock, warmup: int, iters: int
) -> dict[str, Any]:
    import magi2_core as m2
    from magi2_core.distributed import ep_moe_local, ep_plan, ep_slice

    h, e = s.moe_heads, s.experts
    tokens = (s.tokens_local,) * world
    t_all = sum(tokens)
    g = torch.Generator(device=dev).manual_seed(1234)
    x_full = torch.randn(t_all, h, s.d, device=dev, generator=g).bfloat16()
    full = {
        "router": torch.randn(h * e, s.d, device=dev, generator=g) / math.sqrt(s.d),
        "bias": torch.randn(h * e, device=dev, generator=g) * 0.01,
        "w_gate": (torch.randn(h * e, s.d, s.inter, device=dev, generator=g) / 16).bfloat16(),
        "w_up": (torch.randn(h * e, s.d, s.inter, device=dev, generator=g) / 16).bfloat16(),
        "w_down": (torch.randn(h * e, s.inter, s.d, device=dev, generator=g) / math.sqrt(s.inter)).bfloat16(),
    }
    local = {k: ep_slice(v, rank, world, h, e) for k, v in full.items()}
    t0 = rank * s.tokens_local
    x = x_full[t0 : t0 + s.tokens_local].contiguous()
    plan = ep_plan(h, s.tokens_local, tokens=tokens)

    def one_gpu() -> torch.Tensor:
        probs, idx = m2.moe_route(x_full, full["router"], full["bias"], top_k=s.top_k)
        return m2.moe_experts(x_full, probs, idx, full["w_gate"], full["w_up"], full["w_down"])

    ep_stages: list[tuple[str, Callable[[Any], Any]]] = [
        ("a2a_in", lambda _: plan.scatter_heads(x)),
        (
            "compute",
            lambda xl: ep_moe_local(
                xl, plan, local["router"], local["bias"], local["w_gate"], local["w_up"], local["w_down"], top_k=s.top_k
            ),
        ),
        ("a2a_out", lambda yl: plan.gather_heads(yl)),
    ]
    xl = plan.scatter_heads(x)
    n = plan.local_heads
    providers = {"moe_route": "none (phantom-only rank)", "moe_experts": "none (phantom-only rank)"}
    if n:
        rows = n * e
        probs, idx = m2.moe_route(xl, local["router"][:rows], local["bias"][:rows], top_k=s.top_k)
        providers = {
            "moe_route": m2.resolve(
                "moe_route", xl, local["router"][:rows], local["bias"][:rows], top_k=s.top_k
            ).chosen,
            "moe_experts": m2.resolve(
                "moe_experts", xl, probs, idx, local["w_gate"][:rows], local["w_up"][:rows], local["w_down"][:rows]
            ).chosen,
        }
    elt = x.element_size()
    sent = sum(s.tokens_local * c * s.d * elt for r, c in enumerate(plan.head_counts) if r != rank)
    flops_ep = 6.0 * s.d * s.inter * n * t_all * s.top_k
    flops_1 = 6.0 * s.d * s.inter * h * t_all * s.top_k
    result = run_alternating(rank, clock, ep_stages, one_gpu, warmup, iters)
    _, y = staged(clock, ep_stages)
    result["check_vs_one_gpu"] = compare(y, one_gpu()[t0 : t0 + s.tokens_local])
    result.update(
        providers=providers,
        local_heads=n,
        tokens_local=s.tokens_local,
        tokens_total=t_all,
        a2a_bytes_sent_per_direction=sent,
        flops_ep_rank=flops_ep,
        flops_one_gpu=flops_1,
        weight_bytes_ep_rank=n * e * 3 * s.d * s.inter * elt,
        weight_bytes_one_gpu=h * e * 3 * s.d * s.inter * elt,
    )
    return result


def bench_attention(
    rank: int, world: int, s: Shapes, dev: torch.device, clock: Clock, warmup: int, iters: int
) -> dict[str, Any]:
    import magi2_core as m2
    from magi2_core.distributed import ulysses_plans

    h, hd = s.attn_heads, s.head_dim
    t_all = sum(s.segments)
    tl = t_all // world
    tokens = tuple(tl + (1 if r < t_all % world else 0) for r in range(world))
    t0 = sum(tokens[:rank])
    g = torch.Generator(device=dev).manual_seed(4321)
    q, k, v = (torch.randn(t_all, h, hd, device=dev, generator=g).bfloat16() for _ in range(3))
    sinks = torch.randn(1, h, device=dev, generator=g)
    cu = torch.tensor([0, *torch.tensor(s.segments).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    mx = max(s.segments)
    ql, kl, vl = (t[t0 : t0 + tokens[rank]].contiguous() for t in (q, k, v))
    plans = ulysses_plans(h, h, tokens[rank], tokens[rank], tokens_q=tokens, tokens_k=tokens)
    sl = sinks[:, plans.head_slice()].contiguous()
    kw: dict[str, Any] = {"max_seqlen_q": mx, "max_seqlen_k": mx}

    def one_gpu() -> torch.Tensor:
        out: torch.Tensor = m2.attention(q, k, v, cu, cu, sinks=sinks, **kw)
        return out

    ul_stages: list[tuple[str, Callable[[Any], Any]]] = [
        ("a2a_in", lambda _: tuple(p.scatter_heads(t) for p, t in ((plans.q, ql), (plans.kv, kl), (plans.kv, vl)))),
        ("compute", lambda qkv: m2.attention(*qkv, cu, cu, sinks=sl, **kw)),
        ("a2a_out", lambda o: plans.q.gather_heads(o)),
    ]
    qkv_l = ul_stages[0][1](None)
    provider = m2.resolve("attention", *qkv_l, cu, cu, sinks=sl, **kw).chosen
    elt = q.element_size()
    hc = plans.q.local_heads
    sent = 3 * sum(tokens[rank] * hc * hd * elt for r in range(world) if r != rank)
    flops_1 = 4.0 * sum(L * L for L in s.segments) * h * hd
    result = run_alternating(rank, clock, ul_stages, one_gpu, warmup, iters)
    _, o = staged(clock, ul_stages)
    result["check_vs_one_gpu"] = compare(o, one_gpu()[t0 : t0 + tokens[rank]])
    result.update(
        providers={"attention": provider},
        local_heads=hc,
        tokens_local=tokens[rank],
        tokens_total=t_all,
        segments=list(s.segments),
        a2a_bytes_sent_per_direction=sent,
        a2a_bytes_back=sent // 3,
        flops_ep_rank=flops_1 * hc / h,
        flops_one_gpu=flops_1,
    )
    return result


def run_alternating(
    rank: int,
    clock: Clock,
    stages: list[tuple[str, Callable[[Any], Any]]],
    one_gpu: Callable[[], torch.Tensor],
    warmup: int,
    iters: int,
) -> dict[str, Any]:
    """Alternate a distributed call (all ranks) and the one-GPU call (rank 0), flushing L2 before each."""
    times: dict[str, list[float]] = {name: [] for name, _ in stages}
    times["total"] = []
    base: list[float] = []
    for it in range(warmup + iters):
        clock.flush()
        clock.sync()
        dist.barrier()
        ms, _ = staged(clock, stages)
        if it >= warmup:
            for name, value in ms.items():
                times[name].append(value)
            times["total"].append(sum(ms.values()))
        dist.barrier()
        if rank == 0:
            clock.flush()
            clock.sync()
            b, _ = staged(clock, [("one_gpu", lambda _: one_gpu())])
            if it >= warmup:
                base.append(b["one_gpu"])
    out: dict[str, Any] = {"stages_ms": {k: summary(v) for k, v in times.items()}}
    if rank == 0:
        out["one_gpu_ms"] = summary(base)
    return out


def worker(rank: int, world: int, store: str, args: argparse.Namespace) -> None:
    os.environ.update(SAFE_ENV)
    dev = torch.device(f"cuda:{rank}") if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group(
        args.backend,
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=300),
        device_id=dev if dev.type == "cuda" else None,
    )
    try:
        ensure_backends()
        shapes = TINY if args.tiny else PRODUCTION
        clock = Clock(dev)
        per_rank: dict[str, Any] = {"ceilings": measure_ceilings(str(dev)).record() if dev.type == "cuda" else None}
        for layer, fn in (("ep_moe", bench_moe), ("ulysses_attention", bench_attention)):
            if layer in args.layers:
                per_rank[layer] = fn(rank, world, shapes, dev, clock, args.warmup, args.iters)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, per_rank)
        if rank == 0:
            report(world, args, shapes, dev, gathered)
    finally:
        dist.destroy_process_group()


def report(world: int, args: argparse.Namespace, s: Shapes, dev: torch.device, ranks: list[dict[str, Any]]) -> None:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    doc: dict[str, Any] = {
        "benchmark": "distributed",
        "world": world,
        "backend": args.backend,
        "tiny": args.tiny,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "commit": git_commit(),
        "env": {k: os.environ.get(k) for k in SAFE_ENV},
        "warmup": args.warmup,
        "iters": args.iters,
        "shapes": s.__dict__,
        "layers": {},
        "ceilings": ranks[0]["ceilings"],
        "ceilings_per_rank": [r["ceilings"] for r in ranks],
    }
    matmul = doc["ceilings"]["matmul_tflops"] if doc["ceilings"] else None
    rows = []
    for layer in args.layers:
        per = [r[layer] for r in ranks]
        stage_p50 = {st: max(p["stages_ms"][st]["p50"] for p in per) for st in per[0]["stages_ms"]}
        compute_tflops = max(p["flops_ep_rank"] for p in per) / (stage_p50["compute"] * 1e9)
        one = per[0]["one_gpu_ms"]["p50"]
        a2a = stage_p50["a2a_in"] + stage_p50["a2a_out"]
        sent = max(p["a2a_bytes_sent_per_direction"] for p in per)
        doc["layers"][layer] = {
            "per_rank": per,
            "rank_max_p50_ms": stage_p50,
            "one_gpu_p50_ms": one,
            "speedup_vs_one_gpu": one / stage_p50["total"],
            "a2a_share_of_total": a2a / stage_p50["total"],
            "a2a_in_GBps": sent / (stage_p50["a2a_in"] * 1e6),
            "compute_tflops_rank": compute_tflops,
            "one_gpu_tflops": per[0]["flops_one_gpu"] / (one * 1e9),
        }
        if matmul:
            doc["layers"][layer]["compute_fraction_of_matmul_ceiling"] = compute_tflops / matmul
        rows.append((layer, stage_p50, one, per))
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"\n{doc['device']} x{world} ({args.backend}), torch {doc['torch']}, p50 ms (max over ranks)")
    print(
        f"{'layer':18} {'a2a_in':>8} {'compute':>8} {'a2a_out':>8} {'total':>8} {'1-GPU':>8} {'speedup':>8}  "
        f"check (rank0 rel-L2 / bit-equal)  providers"
    )
    for layer, st, one, per in rows:
        c = per[0]["check_vs_one_gpu"]
        print(
            f"{layer:18} {st['a2a_in']:8.3f} {st['compute']:8.3f} {st['a2a_out']:8.3f} {st['total']:8.3f} "
            f"{one:8.3f} {one / st['total']:8.2f}  {c['rel_l2']:.2e} / {c['bit_equal']}  {per[0]['providers']}"
        )
    if matmul:
        print(
            "compute stage at "
            + ", ".join(
                f"{layer} {doc['layers'][layer]['compute_fraction_of_matmul_ceiling']:.2f}" for layer, *_ in rows
            )
            + f" of this device's matmul ({matmul:.0f} TFLOP/s, measured on rank 0 in this run)"
        )
    print(f"wrote {args.out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes, for checking the logic on CPU")
    ap.add_argument(
        "--layers", nargs="+", default=["ep_moe", "ulysses_attention"], choices=("ep_moe", "ulysses_attention")
    )
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results/distributed_h200x2.json")
    args = ap.parse_args()
    os.environ.update(SAFE_ENV)  # inherited by the spawned ranks (and NCCL reads it at init)
    if args.device == "cuda" and torch.cuda.device_count() < args.world:
        raise SystemExit(f"need {args.world} GPUs, found {torch.cuda.device_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(
            worker, args=(args.world, os.path.join(tmp, "store"), args), nprocs=args.world, start_method="spawn"
        )


if __name__ == "__main__":
    main()
