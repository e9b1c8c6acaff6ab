"""Where a call's GPU time goes: the torch profiler's kernels, sorted into the MAGI-2 layer's operators.

The kernels are read from the profiler's Chrome trace, where each appears once (Triton's launches
too, which no aten op encloses). Each kernel is put in one category, first by its name (magi2-core's and
vllm-omni's own kernels, FlashAttention, inductor's fused kernels, torch's copies and gathers), then, for a
matrix product from cuBLAS, by the shapes of the aten op that launched it: the mHC projection reads the 4-stream
width (``K = streams x hidden``), the attention gate writes one logit per head (``N = heads``), the
shared experts' GEMMs have their intermediate width on one side; every other product is a dense
GEMM. What no rule names is "other", and the largest kernels of every category are kept by name so
that a reader can check the sorting, and by where they came from (the launching aten op and its input
shapes), so that a copy or a product can be traced to the code that asked for it.
"""

from __future__ import annotations

import bisect
import json
import re
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GemmWidths", "KernelTime", "breakdown", "category", "kernels_from_trace", "profile_call", "source"]


@dataclass(frozen=True)
class GemmWidths:
    """The widths that tell the layer's matrix products apart."""

    hidden: int  # the model width (3072 in the release)
    streams: int  # mHC streams (4)
    heads_q: int  # attention heads: the gate projection's output width (24)
    shared_intermediate: tuple[int, ...]  # the shared experts' intermediate widths (1280)

    @classmethod
    def of(cls, cfg: Any) -> GemmWidths:
        """The widths of a vllm-omni ``Magi2PreviewConfig``."""
        moe = cfg.moe
        return cls(
            hidden=cfg.hidden_size,
            streams=cfg.mhc.num_streams,
            heads_q=cfg.num_heads_q,
            shared_intermediate=(moe.shared_expert_intermediate_size, moe.modality_shared_expert_intermediate_size),
        )


@dataclass(frozen=True)
class KernelTime:
    """One kernel launch: its name, device time and the shapes of the aten op that launched it."""

    name: str
    us: float = 1.0
    op: str = ""
    shapes: tuple[tuple[int, ...], ...] = ()


# Name rules, first match wins. Inductor's kernels are named after the ops they fuse.
_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"flash|fmha|FlashAttn|_sink_correction_kernel", "attention"),
    (  # before route: the experts' top-k combine (topk_sum_kernel) is theirs, not the router's
        r"fused_expert|gemm1_swiglu7|gemm2_weighted|_mh_moe_kernel|_count_kernel|_offsets_kernel|_scatter_kernel"
        r"|_stable_scatter_kernel|_blocks_kernel|_lists_kernel|_chunk_counts_kernel|_chunk_scan_kernel|topk_sum_kernel",
        "routed experts",
    ),
    (r"_route_kernel|_select_kernel|topk|TopK|bitonic|radix|[Ss]ort", "route"),
    (r"_rmsnorm_kernel", "rmsnorm"),
    (r"_mhc_", "mHC kernels"),
    (r"_qk_norm_rope_kernel", "q/k norm + RoPE"),
    (r"_output_gate_kernel", "output gate"),
    (r"^triton_", "inductor fused"),
    (r"CatArrayBatchedCopy|cat_", "torch.cat"),
    (r"indexSelect|index_select|gather|scatter|index_elementwise|indexing_backward", "gathers"),
)
_GEMM = re.compile(r"gemm|gemv|xmma|cutlass|nvjet|cublas|sm90_|sm80_|ampere_|hopper_|splitKreduce|Kernel2", re.I)


def _gemm_category(k: KernelTime, w: GemmWidths) -> str:
    dims = [s for s in k.shapes if len(s) >= 2]
    if len(dims) >= 2:
        a, b = dims[0], dims[1]
        depth, width = a[-1], (b[-1] if k.op != "aten::linear" else b[0])
        if depth == w.streams * w.hidden:
            return "mHC projection"
        if depth == w.streams and len(a) == 3:  # per-token sums over the streams (einsum / bmm)
            return "mHC stream sums"
        if width == w.heads_q and depth == w.hidden:
            return "attention gate projection"
        if depth in w.shared_intermediate or width in {2 * i for i in w.shared_intermediate}:
            return "shared experts"
    return "dense GEMMs"


def category(k: KernelTime, widths: GemmWidths) -> str:
    """The operator a kernel belongs to (see the module's docstring)."""
    for pattern, name in _NAME_RULES:
        if re.search(pattern, k.name):
            return name
    if _GEMM.search(k.name):
        return _gemm_category(k, widths)
    return "torch elementwise and copies"


def breakdown(kernels: Iterable[KernelTime], widths: GemmWidths, *, top: int = 6) -> dict[str, Any]:
    """Milliseconds and launches per category, largest first, with each category's largest kernels."""
    ms: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    by_name: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_source: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for k in kernels:
        cat = category(k, widths)
        ms[cat] += k.us / 1e3
        launches[cat] += 1
        by_name[cat][k.name[:120]] += k.us / 1e3
        by_source[cat][source(k)] += k.us / 1e3
    total = sum(ms.values())
    rows = {
        cat: {
            "ms": round(v, 4),
            "share": round(v / total, 4) if total else 0.0,
            "launches": launches[cat],
            "top_kernels": _largest(by_name[cat], top),
            "top_sources": _largest(by_source[cat], top),
        }
        for cat, v in sorted(ms.items(), key=lambda x: -x[1])
    }
    return {"kernel_ms": round(total, 4), "launches": sum(launches.values()), "categories": rows}


def source(k: KernelTime) -> str:
    """Where a kernel came from: its name, the aten op that launched it and that op's input shapes."""
    shapes = " ".join(str(list(s)) for s in k.shapes[:3])
    return f"{k.name[:60]} <- {k.op or 'no aten op'}{' ' + shapes if shapes else ''}"


def _largest(ms: dict[str, float], top: int) -> dict[str, float]:
    return {n: round(t, 4) for n, t in sorted(ms.items(), key=lambda x: -x[1])[:top]}


def _enclosing_op(
    launch: dict[str, Any] | None, ops: dict[Any, list[dict[str, Any]]], starts: dict[Any, list[float]]
) -> dict[str, Any] | None:
    """The innermost aten op running on the launching thread when ``launch`` (a runtime call) ran."""
    if launch is None:
        return None
    key = (launch.get("pid"), launch.get("tid"))
    thread, t = ops.get(key, []), float(launch.get("ts", 0.0))
    i = bisect.bisect_right(starts.get(key, []), t) - 1
    for op in reversed(thread[max(0, i - 400) : i + 1]):  # ops started before the launch, latest first
        if op["name"].startswith("aten::") and float(op["ts"]) + float(op.get("dur", 0.0)) >= t:
            return op
    return None


def kernels_from_trace(trace: dict[str, Any] | list[dict[str, Any]]) -> list[KernelTime]:
    """Every device kernel, copy and memset of a Chrome trace (the torch profiler's export), once each,
    with the shapes of the aten op that launched it (linked by the launch's correlation id)."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    ops: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    launches: dict[Any, dict[str, Any]] = {}
    device: list[dict[str, Any]] = []
    for e in events:
        cat = e.get("cat", "")
        if cat == "cpu_op":
            ops[(e.get("pid"), e.get("tid"))].append(e)
        elif cat in ("cuda_runtime", "cuda_driver"):
            launches[e.get("args", {}).get("correlation")] = e
        elif cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            device.append(e)
    for thread in ops.values():
        thread.sort(key=lambda e: float(e["ts"]))
    starts = {key: [float(e["ts"]) for e in thread] for key, thread in ops.items()}
    out = []
    for k in device:
        op = _enclosing_op(launches.get(k.get("args", {}).get("correlation")), ops, starts)
        dims = (op or {}).get("args", {}).get("Input Dims", []) if op else []
        shapes = tuple(
            tuple(int(d) for d in s) for s in dims if isinstance(s, list) and all(isinstance(d, int) for d in s)
        )
        out.append(
            KernelTime(str(k.get("name", "")), float(k.get("dur", 0.0)), str((op or {}).get("name", "")), shapes)
        )
    return out


def profile_call(fn: Callable[[], object]) -> list[KernelTime]:
    """Run ``fn`` once under the torch profiler (CPU + CUDA, shapes recorded): its kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return kernels_from_trace(json.loads(path.read_text()))
