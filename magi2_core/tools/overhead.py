"""Dispatch-overhead measurement: what the registry adds to a provider call (host time).

The added cost is measured against a no-op provider of every op, registered in process for the
measurement, so that kernel time (and its cache effects) cannot hide or inflate it: ``public`` is
the op call with ``provider=`` naming the no-op, ``direct`` the no-op called by hand with the call
record a provider receives (built once, beforehand), ``added`` their difference (validation + cached
resolution + building the record). ``resolve`` times the cached resolution of the call's typed key alone.
``added_inference_us`` is ``added`` under ``torch.inference_mode``, as vllm-omni runs MAGI-2: the public
call then skips the check that no input requires grad.

``device`` places every input there and makes the no-op serve that device type. ``"cuda"`` is the
serving path: prefix sums and expert ids on the GPU, so that (with ``max_seqlen_*`` given) no value
is read back per call; ``"cpu"`` has host prefix sums and host expert ids, whose values are checked
on every call (the prefix sums through the call-layout key, the ids by a range scan).
"""

from __future__ import annotations

import sys
import timeit
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch

import magi2_core as m2
from magi2_core.errors import InvalidDeviceError
from magi2_core.model.backend_spec import BackendSpec
from magi2_core.model.capability import Capability
from magi2_core.model.problem import OPS, OUT_DTYPE_OPS, Feature
from magi2_core.ops import SPECS, dispatcher

__all__ = ["DEVICES", "dispatch_overhead"]

_NOOP = "magi2_core_bench_noop"
NOOP_PROVIDER = "bench_noop"
DEVICES = ("cpu", "cuda")


def _noop_attention(call: tuple[Any, ...]) -> tuple[torch.Tensor, None]:
    return call[0], None


def _noop_moe_route(call: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    return call[0], call[0]


def _noop_mhc_pre(call: tuple[Any, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return call[0], call[0], call[0]


def _noop_tensor(call: tuple[Any, ...]) -> torch.Tensor:
    x: torch.Tensor = call[0]
    return x


_KERNELS: dict[str, Callable[..., Any]] = {
    "attention": _noop_attention,
    "moe_route": _noop_moe_route,
    "moe_experts": _noop_tensor,
    "rmsnorm": _noop_tensor,
    "mhc_pre": _noop_mhc_pre,
    "mhc_mix": _noop_tensor,
    "qk_norm_rope": _noop_tensor,
    "output_gate": _noop_tensor,
}


@contextmanager
def noop_backend(device: str = "cpu") -> Iterator[None]:
    """A backend whose provider ``bench_noop`` of every op returns its first input (``device``, FP32, every feature)."""
    kernels = types.ModuleType(_NOOP)
    for op, fn in _KERNELS.items():
        setattr(kernels, op, fn)
    sys.modules[_NOOP] = kernels
    caps = tuple(
        Capability(
            op=op,
            name=NOOP_PROVIDER,
            impl=f"{_NOOP}:{op}",
            device_types=(device,),
            dtypes=("float32",),
            out_dtypes=("float32",) if op in OUT_DTYPE_OPS else None,
            features=frozenset(Feature),
            priority=-1000,
        )
        for op in OPS
    )
    reg = m2.get_registry()
    reg.register(
        BackendSpec(name="magi2-bench-noop", version="0", core_api=">=2.0,<3", providers=caps), name=NOOP_PROVIDER
    )
    try:
        yield
    finally:
        reg.unregister(NOOP_PROVIDER)
        del sys.modules[_NOOP]


def _per_call_us(fn: Callable[[], object], iters: int) -> float:
    fn()
    return min(timeit.repeat(fn, number=iters, repeat=5)) / iters * 1e6


def dispatch_overhead(iters: int = 20000, device: str = "cpu") -> list[dict[str, Any]]:
    """Per op: cached resolve, the public call and the direct call of a no-op provider (best of 5, µs).

    Every input lives on ``device`` (``"cpu"`` or ``"cuda"``, see the module docstring).
    """
    if device not in DEVICES:
        raise InvalidDeviceError("overhead", "device", " or ".join(map(repr, DEVICES)), repr(device))
    if device == "cuda" and not torch.cuda.is_available():
        raise InvalidDeviceError(
            "overhead",
            "device",
            "'cpu' here (CUDA needs an NVIDIA GPU and a CUDA build of torch)",
            f"'cuda', but torch {torch.__version__} sees no CUDA device",
        )
    torch.manual_seed(0)
    disp = dispatcher()

    def on(t: torch.Tensor) -> torch.Tensor:
        return t.to(device)

    q = on(torch.randn(4, 2, 8))
    cu = on(torch.tensor([0, 4], dtype=torch.int32))
    x = on(torch.randn(4, 2, 8))
    router = on(torch.randn(2 * 4, 8))
    bias = on(torch.randn(2 * 4))
    probs, idx = on(torch.rand(2, 4, 2)), on(torch.randint(0, 4, (2, 4, 2)))
    wg, wu, wd = on(torch.randn(8, 8, 16)), on(torch.randn(8, 8, 16)), on(torch.randn(8, 16, 8))
    xn, wn = on(torch.randn(4, 8)), on(torch.randn(1, 1, 8))
    wq = wn[0]  # indexed once: an index in the timed lambda would be timed as dispatch
    streams, branch = on(torch.randn(4, 2, 8)), on(torch.randn(4, 8))  # n = 2 streams of D = 8
    mw, phi = on(torch.randn(16)), on(torch.randn(16, 8))  # 2n + n² = 8 logits
    a, bn, bnn = on(torch.rand(1)), on(torch.randn(2)), on(torch.randn(2, 2))
    post, res = on(torch.rand(4, 2)), on(torch.rand(4, 2, 2))
    rope = on(torch.randn(4, 8))  # cat(sin, cos) of 4 angles per token: all 8 dims of q rotate
    gate, order = on(torch.randn(4, 2)), on(torch.tensor([3, 1, 0, 2]))  # one logit per (row, head); a gather
    p = NOOP_PROVIDER
    calls: dict[
        str, tuple[Callable[[], object], Callable[[tuple[Any, ...]], object], tuple[Any, ...], dict[str, Any]]
    ] = {
        "attention": (
            lambda: m2.attention(q, q, q, cu, cu, max_seqlen_q=4, max_seqlen_k=4, provider=p),
            _noop_attention,
            (q, q, q, cu, cu),
            {"max_seqlen_q": 4, "max_seqlen_k": 4},
        ),
        "moe_route": (
            lambda: m2.moe_route(x, router, bias, top_k=2, provider=p),
            _noop_moe_route,
            (x, router, bias),
            {"top_k": 2},
        ),
        "moe_experts": (
            lambda: m2.moe_experts(x, probs, idx, wg, wu, wd, provider=p),
            _noop_tensor,
            (x, probs, idx, wg, wu, wd),
            {},
        ),
        "rmsnorm": (lambda: m2.rmsnorm(xn, wn, provider=p), _noop_tensor, (xn, wn), {}),
        "mhc_pre": (
            lambda: m2.mhc_pre(streams, mw, phi, a, a, a, bn, bn, bnn, provider=p),
            _noop_mhc_pre,
            (streams, mw, phi, a, a, a, bn, bn, bnn),
            {},
        ),
        "mhc_mix": (
            lambda: m2.mhc_mix(streams, branch, post, res, provider=p),
            _noop_tensor,
            (streams, branch, post, res),
            {},
        ),
        "qk_norm_rope": (lambda: m2.qk_norm_rope(q, wq, rope, provider=p), _noop_tensor, (q, wq, rope), {}),
        "output_gate": (lambda: m2.output_gate(q, gate, index=order, provider=p), _noop_tensor, (q, gate), {}),
    }
    rows = []
    with noop_backend(device):
        for op, (public, noop, args, kwargs) in calls.items():
            spec = SPECS[op]  # type: ignore[index]
            call = spec.validate_arguments(args, kwargs)
            rows.append(
                _row(
                    op,
                    iters,
                    resolve=partial(disp.kernel, spec, call.key, None),
                    public=public,
                    direct=partial(noop, call),
                )
            )
    return rows


def _row(
    op: str, iters: int, *, resolve: Callable[[], object], public: Callable[[], object], direct: Callable[[], object]
) -> dict[str, Any]:
    r = _per_call_us(resolve, iters)
    p = _per_call_us(public, iters)
    d = _per_call_us(direct, iters)
    with torch.inference_mode():  # how vllm-omni runs MAGI-2: no autograd checks of the inputs
        p_inf = _per_call_us(public, iters)
        d_inf = _per_call_us(direct, iters)
    return {
        "op": op,
        "resolve_us": r,
        "public_us": p,
        "direct_us": d,
        "added_us": p - d,
        "added_inference_us": p_inf - d_inf,
    }
