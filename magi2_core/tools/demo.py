"""One MAGI-2 layer at toy widths, run through the public ops on the best device present.

The attention branch: ``mhc_pre`` (the branch input from four streams) -> ``rmsnorm`` (three
modalities) -> the QKV and gate projection -> ``qk_norm_rope`` for q and k (tokens from modality to
sequence order) -> ``attention`` with one learned sink over two packed segments -> ``output_gate``
(back to modality order) -> the output projection -> ``mhc_mix``. The MoE branch: ``mhc_pre`` ->
``rmsnorm`` -> ``moe_route`` (sigmoid top-k) -> ``moe_experts`` (SwiGLU7) -> ``mhc_mix``.

Every call is compared with a float64 oracle on the inputs it received (the reference provider's kernel
on float64 copies of them), so the errors of one call do not add to the next one's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

import magi2_core as m2
from magi2_core.contracts.acceptance import rel_l2
from magi2_core.model.devices import cuda_available, musa_available
from magi2_core.model.problem import OpName
from magi2_core.ops import SPECS

__all__ = ["OpReport", "best_device", "run_demo"]


@dataclass(frozen=True)
class OpReport:
    """One op call of the demo layer: its branch, who served it, its error against the float64 oracle (the worst of its
    floating outputs), and its median time."""

    op: str
    branch: str  # the layer's branch, "attention" or "MoE" (", q" / ", k": which of the two q/k calls)
    provider: str
    device: str
    dtype: str
    max_abs_err: float
    rel_l2_err: float
    median_ms: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def best_device() -> torch.device:
    if cuda_available():
        return torch.device("cuda")
    if musa_available():
        return torch.device("musa")
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    fn()  # warm-up (compilation, caches, resolution)
    samples = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _oracle(op: OpName, *args: Any, **kwargs: Any) -> Any:
    """The reference provider's kernel on the validated call with float64 copies of its floating tensors
    (and a float64 ``out_dtype``): a float64 evaluation of the op's math."""
    provider = m2.get_registry().provider(op, "reference")
    assert provider is not None, "the reference backend is not installed"
    kernel, error = provider.load()
    assert error is None, error
    spec = SPECS[op]
    call = spec.validate_arguments(args, kwargs)
    up: dict[str, Any] = {
        f: v.double()
        for f, v in zip(call._fields, call, strict=True)
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    }
    if "out_dtype" in call._fields:
        up["out_dtype"] = torch.float64
    return spec.run(kernel, call._replace(**up))


def _errors(op: OpName, out: Any, ref: Any) -> tuple[float, float]:
    """The largest absolute error and the worst relative L2 error over the op's floating outputs."""
    spec = SPECS[op]
    got, want = spec.outputs(out), spec.outputs(ref)
    abs_err = rel_err = 0.0
    for name, t in got.items():
        if not t.is_floating_point():
            continue
        r = want[name]
        if t.numel():
            abs_err = max(abs_err, (t.double() - r.double()).abs().max().item())
        rel_err = max(rel_err, rel_l2(t, r))
    return abs_err, rel_err


def _permutation(tokens: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A token order: ``to_seq[s]`` is the modality-ordered row at sequence position ``s``, ``to_mod`` its
    inverse (MAGI-2 norms its tokens grouped by modality and attends over them in sequence order)."""
    to_seq = torch.randperm(tokens, generator=g)
    return to_seq, torch.argsort(to_seq)


def run_demo(
    device: torch.device | None = None, seed: int = 0, repeats: int = 3, progress: Callable[[str], None] | None = None
) -> list[OpReport]:
    """Run the demo layer on ``device`` (default: :func:`best_device`); one report per op call, in order."""
    dev = device or best_device()
    dtype = torch.bfloat16 if dev.type != "cpu" else torch.float32
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int, scale: float = 1.0, dt: torch.dtype = dtype) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(device=dev, dtype=dt)

    tokens, width, streams_n, heads, head_dim, rotary = 257, 768, 4, 6, 128, 64
    moe_heads, experts, top_k, inter = 3, 16, 6, 256
    d = width // moe_heads
    sizes = [160, 64, 33]  # video, audio, text tokens, in modality order
    cu = torch.tensor([0, 97, tokens], dtype=torch.int32, device=dev)  # two packed segments, sequence order
    to_seq, to_mod = (t.to(dev) for t in _permutation(tokens, g))

    def mhc_params() -> tuple[torch.Tensor, ...]:
        f32 = torch.float32
        n, wide = streams_n, streams_n * width
        return (
            rnd(len(sizes) * wide, scale=0.1, dt=f32),  # norm_weight, modality-major
            rnd(wide, 2 * n + n * n, scale=wide**-0.5, dt=f32),  # phi: pre, post, residual columns
            *(rnd(1, scale=0.5, dt=f32) + 1 for _ in range(3)),  # alpha_pre, alpha_post, alpha_res
            rnd(n, scale=0.1, dt=f32),  # bias_pre
            rnd(n, scale=0.1, dt=f32),  # bias_post
            rnd(n, n, scale=0.1, dt=f32),  # bias_res
        )

    streams = rnd(tokens, streams_n, width)
    mhc_attn, mhc_moe = mhc_params(), mhc_params()
    norm_attn = rnd(len(sizes), width, scale=0.1, dt=torch.float32)
    norm_moe = rnd(len(sizes), width, scale=0.1, dt=torch.float32)
    w_qkvg = rnd(width, 3 * width + heads, scale=width**-0.5)  # q, k, v and one gate logit per head
    qk_weight = rnd(len(sizes), head_dim, scale=0.1, dt=torch.float32)
    angles = torch.rand(tokens, rotary // 2, generator=g) * 6.3
    rope = torch.cat([angles.sin(), angles.cos()], dim=-1).to(device=dev, dtype=torch.float32)  # sequence order
    sinks = rnd(1, heads, dt=torch.float32)
    w_out = rnd(width, width, scale=width**-0.5)
    router = rnd(moe_heads * experts, d, scale=d**-0.5, dt=torch.float32)
    bias = rnd(moe_heads * experts, scale=0.01, dt=torch.float32)
    w_gate = rnd(moe_heads * experts, d, inter, scale=1 / 16)
    w_up = rnd(moe_heads * experts, d, inter, scale=1 / 16)
    w_down = rnd(moe_heads * experts, inter, d, scale=inter**-0.5)
    reports: list[OpReport] = []

    def call(op: OpName, branch: str, *args: Any, **kwargs: Any) -> Any:
        """Run one op as a user would, time it, and report it against the float64 oracle."""
        fn: Callable[..., Any] = getattr(m2, op)
        chosen = m2.resolve(op, *args, **kwargs).chosen or "?"
        out = fn(*args, **kwargs)
        ref = _oracle(op, *args, **kwargs)
        if op == "moe_route" and not torch.equal(out[1].cpu(), ref[1].cpu()):
            ref = out  # a near-tie picked another expert: the experts below run on the same routes
        abs_err, rel_err = _errors(op, out, ref)
        ms = _time_ms(lambda: fn(*args, **kwargs), dev, repeats)
        reports.append(OpReport(op, branch, chosen, str(dev), str(dtype).removeprefix("torch."), abs_err, rel_err, ms))
        if progress is not None:
            progress(f"{op} ({branch}): {chosen}")
        return out

    # the attention branch
    x, post, residual = call("mhc_pre", "attention", streams, *mhc_attn, modality_sizes=sizes)
    h = call("rmsnorm", "attention", x, norm_attn, modality_sizes=sizes)
    qkvg = h @ w_qkvg
    q_view, k_view, v_view = qkvg[:, : 3 * width].view(tokens, 3, heads, head_dim).unbind(1)
    gate = qkvg[:, 3 * width :]
    rope_kw: dict[str, Any] = dict(modality_sizes=sizes, index=to_seq)
    q = call("qk_norm_rope", "attention, q", q_view, qk_weight, rope, **rope_kw)
    k = call("qk_norm_rope", "attention, k", k_view, qk_weight, rope, **rope_kw)
    v = v_view[to_seq]
    attn_kw: dict[str, Any] = dict(max_seqlen_q=160, max_seqlen_k=160, sinks=sinks)
    o = call("attention", "attention", q, k, v, cu, cu, **attn_kw)
    y = call("output_gate", "attention", o, gate, index=to_mod)
    streams = call("mhc_mix", "attention", streams, y.reshape(tokens, width) @ w_out, post, residual)

    # the MoE branch
    x, post, residual = call("mhc_pre", "MoE", streams, *mhc_moe, modality_sizes=sizes)
    xm = call("rmsnorm", "MoE", x, norm_moe, modality_sizes=sizes).view(tokens, moe_heads, d)
    probs, idx = call("moe_route", "MoE", xm, router, bias, top_k=top_k)
    ym = call("moe_experts", "MoE", xm, probs, idx, w_gate, w_up, w_down)
    call("mhc_mix", "MoE", streams, ym.reshape(tokens, width), post, residual)
    return reports
