"""The ``rmsnorm`` operator: FP32 normalisation with modality-major ``(w + 1)`` scales.

``x [T, D]`` or ``[T, ..., P', D]`` with tokens on dim 0; ``weight [M, P, D]`` (a flat ``[M·P·D]``
parameter is viewed so, given ``modality_sizes``). Token group m (contiguous, host-side sizes summing
to T, empty groups allowed) is scaled by ``w[m] + 1``; P = 1 broadcasts over the pattern axis, P > 1
needs ``x.shape[-2] == P``. The output is cast once to ``out_dtype or x.dtype``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import torch

from magi2_core import shadow as _shadow
from magi2_core.capability import Capability
from magi2_core.contracts import _checks as ck
from magi2_core.contracts import acceptance as acc
from magi2_core.errors import InvalidDTypeError, InvalidShapeError, InvalidValueError
from magi2_core.ops._dispatch import dispatcher
from magi2_core.ops._spec import ExplainError, OpSpec, dense, forward_only
from magi2_core.overrides import context_token
from magi2_core.problem import FEATURE_BIT, Feature, Problem
from magi2_core.testing.case import Call, Case, dtype_of, make_case, randn

__all__ = ["DEFAULT_EPS", "SPEC", "RMSNormCall", "RMSNormKernel", "RMSNormKey", "rmsnorm", "validate"]

OP: Literal["rmsnorm"] = "rmsnorm"
DEFAULT_EPS = 1e-6
_COMPILING = FEATURE_BIT[Feature.COMPILING]


class RMSNormKey(NamedTuple):
    """The typed problem of an RMSNorm call: what provider selection may depend on."""

    device: torch.device | str
    dtype: str
    out_dtype: str
    features: int
    tokens: int
    width: int
    num_modalities: int
    num_patterns: int


class RMSNormCall(NamedTuple):
    """One validated RMSNorm call: what a provider receives, whole and frozen (the core API 2 ABI).

    ``weight`` is ``[M, P, D]`` (a flat parameter viewed so), ``modality_sizes`` a tuple of host ints
    or ``None`` (one modality), ``out_dtype`` resolved. The tensors come first: a repeated layout
    reuses the rest.
    """

    x: torch.Tensor
    weight: torch.Tensor
    eps: float
    modality_sizes: tuple[int, ...] | None
    out_dtype: torch.dtype
    key: RMSNormKey


_TENSORS = 2  # the leading tensor fields of RMSNormCall; a cache hit reuses the fields after them
_record = tuple.__new__  # builds a NamedTuple from a tuple without its Python-level __new__ (the hot path)


class RMSNormKernel(Protocol):
    """What an ``rmsnorm`` provider's kernel object is called with: one :class:`RMSNormCall`."""

    def __call__(self, call: RMSNormCall) -> torch.Tensor:
        """Return the normalised, scaled ``x`` cast once to ``call.out_dtype``."""
        ...


def validate(
    x: object,
    weight: object,
    *,
    eps: float,
    modality_sizes: object,
    out_dtype: torch.dtype | None,
    compiling: bool,
) -> RMSNormCall:
    """Check every argument (raising an input error that names it) and normalise the inputs."""
    x = ck.tensor(OP, "x", x)
    ck.with_data(OP, "x", x)
    ck.dtype_in(OP, "x", x, ck.FLOATS)
    if x.dim() < 2:
        raise InvalidShapeError(OP, "x", "[tokens, D] or [tokens, ..., patterns, D] (at least 2-D)", ck.describe(x))
    t, d = x.shape[0], x.shape[-1]
    w = ck.tensor(OP, "weight", weight)
    ck.dtype_in(OP, "weight", w, ck.FLOATS)
    ck.same_device(OP, "x", x, weight=w)
    sizes: tuple[int, ...] | None = None
    if modality_sizes is not None:
        if isinstance(modality_sizes, torch.Tensor):
            raise InvalidShapeError(OP, "modality_sizes", "a host-side list of ints (not a tensor: no device sync)",
                                    ck.describe(modality_sizes))
        if not isinstance(modality_sizes, Sequence):
            raise InvalidShapeError(OP, "modality_sizes", "a list of ints or None", type(modality_sizes).__name__)
        sizes = tuple(modality_sizes)
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sizes):
            raise InvalidShapeError(OP, "modality_sizes", "a non-empty list of non-negative ints", repr(modality_sizes))
        if sum(sizes) != t:
            raise InvalidShapeError(OP, "modality_sizes", f"sizes summing to the token count x.shape[0] = {t}",
                                    f"{list(sizes)} (sum {sum(sizes)})")
    m = len(sizes) if sizes is not None else 1
    if w.dim() == 1:
        if w.numel() % max(m * d, 1) != 0 or (d == 0 and w.numel() != 0):
            raise InvalidShapeError(OP, "weight", f"[M·P·D] with M = {m} modalities and D = {d}", ck.describe(w))
        # an empty width says nothing about P: one pattern, which broadcasts over any
        w = w.view(m, w.numel() // (m * d) if d else 1, d)
    if w.dim() != 3 or w.shape[0] != m or w.shape[2] != d:
        raise InvalidShapeError(OP, "weight", f"[{m}, P, {d}] (modalities, patterns, width)", ck.describe(w))
    p = w.shape[1]
    if p != 1 and (x.dim() < 3 or x.shape[-2] != p):
        raise InvalidShapeError(OP, "x", f"[tokens, ..., {p}, {d}] to match weight's {p} patterns", ck.describe(x))
    e = ck.real(OP, "eps", eps, "a finite float >= 0")
    if not math.isfinite(e) or e < 0:  # eps = 0 is allowed: an all-zero row is then 0/0 = NaN, by definition
        raise InvalidValueError(OP, "eps", "a finite float >= 0", repr(eps))
    od = x.dtype if out_dtype is None else out_dtype
    if od not in ck.FLOATS:
        raise InvalidDTypeError(OP, "out_dtype", "None, torch.float32, torch.bfloat16 or torch.float16", repr(out_dtype))
    mask = _COMPILING if compiling else 0
    key = RMSNormKey(x.device, ck.dtype_name(x.dtype), ck.dtype_name(od), mask, t, d, m, p)
    return RMSNormCall(x, w, e, sizes, od, key)


class _Bound(NamedTuple):
    kernel: Any
    provider: str
    rest: tuple[Any, ...]  # the validated call's fields after its tensors (scalars and the key)
    view: torch.Size | None  # a flat weight's [M, P, D] shape


def _bind(x: torch.Tensor, weight: torch.Tensor, eps: float, modality_sizes: Sequence[int] | None,
          out_dtype: torch.dtype | None, provider: str | None, compiling: bool) -> _Bound:
    """Validate and resolve, or find both done for this call layout."""
    d = dispatcher()
    bound = d.bound_calls()
    try:
        layout = (
            OP, provider, context_token(), x.shape, x.dtype, x.device, weight.shape, weight.dtype, weight.device,
            eps, type(eps), None if modality_sizes is None else (type(modality_sizes), *modality_sizes), out_dtype,
            compiling,
        )  # fmt: skip
        hit: _Bound | None = bound.get(layout)
    except (AttributeError, TypeError, RuntimeError):  # not tensors, or unhashable: validation says what
        layout, hit = None, None
    if hit is not None:
        return hit
    call = validate(x, weight, eps=eps, modality_sizes=modality_sizes, out_dtype=out_dtype, compiling=compiling)
    kernel, name = d.kernel(SPEC, call.key, provider)
    hit = _Bound(kernel, name, call[_TENSORS:], call.weight.shape if call.weight is not weight else None)
    # modality sizes are kept by value only for plain ints (a bool or an int subclass must meet validation)
    plain = modality_sizes is None or all(type(s) is int for s in modality_sizes)
    if layout is not None and plain and not ck.any_tensor(eps):
        if len(bound) >= d.BOUND_LIMIT:
            bound.clear()
        bound[layout] = hit
    return hit


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    eps: float = DEFAULT_EPS,
    modality_sizes: Sequence[int] | None = None,
    out_dtype: torch.dtype | None = None,
    provider: str | None = None,
) -> torch.Tensor:
    """Multi-modality RMSNorm: ``x·rsqrt(mean(x²)+eps)·(w[m]+1)`` in FP32, cast once.

    ``x [T, D]`` or ``[T, ..., P, D]``; ``weight [M, P, D]`` (or flat ``[M·P·D]``) delta-scale;
    ``modality_sizes``: host-side sizes of the M contiguous token groups (None: one modality).
    """
    if torch.is_grad_enabled() and (getattr(x, "requires_grad", False) or getattr(weight, "requires_grad", False)):
        forward_only(OP, x=x, weight=weight)
    if torch.compiler.is_compiling():
        sizes = None if modality_sizes is None else list(modality_sizes)
        y: torch.Tensor = torch.ops.magi2.rmsnorm(x, weight, float(eps), sizes, out_dtype, provider)
        return y
    b = _bind(x, weight, eps, modality_sizes, out_dtype, provider, False)
    if b.view is not None:
        weight = weight.view(b.view)
    # one record per call, built without the NamedTuple's Python __new__ (concatenation: faster than *)
    call: RMSNormCall = _record(RMSNormCall, (x, weight) + b.rest)  # noqa: RUF005
    out: torch.Tensor = b.kernel(call)
    scope = _shadow.sampling()
    if scope is not None:
        _shadow.observe(scope, SPEC, b.provider, call, out)
    return out


@torch.library.custom_op("magi2::rmsnorm", mutates_args=())
def _rmsnorm_op(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    modality_sizes: list[int] | None,
    out_dtype: torch.dtype | None,
    provider: str | None,
) -> torch.Tensor:
    call = validate(x, weight, eps=eps, modality_sizes=modality_sizes, out_dtype=out_dtype, compiling=True)
    kernel, name = dispatcher().kernel(SPEC, call.key, provider)
    out: torch.Tensor = SPEC.run(kernel, call)
    scope = _shadow.sampling()
    if scope is not None:
        _shadow.observe(scope, SPEC, name, call, out)
    return dense(out)


@_rmsnorm_op.register_fake
def _(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    modality_sizes: list[int] | None,
    out_dtype: torch.dtype | None,
    provider: str | None,
) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=out_dtype or x.dtype)


_NORM_LAYOUTS: dict[str, dict[str, Any]] = {
    "2d": {"shape": (33, 64), "sizes": None, "patterns": 1},
    "patterns": {"shape": (9, 3, 48), "sizes": None, "patterns": 3},
    "modalities-empty-group": {"shape": (12, 64), "sizes": (5, 0, 7), "patterns": 1},
    "modalities-patterns-4d": {"shape": (10, 2, 3, 32), "sizes": (4, 6), "patterns": 3},
    "flat-weight": {"shape": (11, 2, 40), "sizes": (6, 5), "patterns": 2, "flat": True},
    "broadcast-pattern": {"shape": (7, 4, 32), "sizes": (3, 4), "patterns": 1},
    "t0": {"shape": (0, 64), "sizes": (0,), "patterns": 1},
    "width0": {"shape": (6, 3, 0), "sizes": (2, 4), "patterns": 3},  # the empty result, as upstream
    "t0-width0": {"shape": (0, 0), "sizes": None, "patterns": 1},
}


class RMSNormSpec(OpSpec[RMSNormCall, RMSNormKey]):
    name = OP
    family = "rmsnorm"
    key_type = RMSNormKey
    arg_names = ("x", "weight")
    kernel_protocol = RMSNormKernel
    has_out_dtype = True

    def validate_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> RMSNormCall:
        kw = dict(kwargs)
        return validate(*args, eps=kw.pop("eps", DEFAULT_EPS), modality_sizes=kw.pop("modality_sizes", None),
                        out_dtype=kw.pop("out_dtype", None), compiling=False, **kw)

    def outputs(self, out: Any) -> dict[str, torch.Tensor]:
        return {"y": out}

    def accept(self, problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor],
               call: Any) -> list[acc.Acceptance]:
        return [acc.accept_rmsnorm(got["y"], ref["y"])]

    def cases(self, cap: Capability, device: str, max_tokens: int) -> Iterator[Case]:
        for dtype in cap.dtypes:
            outs: list[str | None] = [None]
            claimed = cap.out_dtypes if cap.out_dtypes is not None else ("float32",)
            outs += [o for o in claimed if o != dtype]
            if cap.out_dtypes is not None and dtype not in cap.out_dtypes:
                outs.remove(None)  # the default out dtype (x's) is not claimed
            for name, layout in _NORM_LAYOUTS.items():
                for out in outs:
                    params = {"flat": False, "eps": 1e-6, "weight_dtype": "float32", "out_dtype": out} | layout
                    label = name + ("" if out is None else f"-out-{out}")
                    yield make_case(OP, cap, device, dtype, label, params)
            yield make_case(OP, cap, device, dtype, "weight-in-x-dtype-eps1e-5",
                            {"flat": False, "eps": 1e-5, "weight_dtype": dtype, "out_dtype": None} | _NORM_LAYOUTS["2d"])

    def case_problem(self, case: Case) -> Problem:
        p = case.p
        sizes = p["sizes"]
        return Problem(op=OP, device_type=case.device, dtype=case.dtype, out_dtype=p["out_dtype"] or case.dtype,
                       tokens=p["shape"][0], width=p["shape"][-1], num_modalities=1 if sizes is None else len(sizes),
                       num_patterns=p["patterns"])

    def build(self, case: Case, g: torch.Generator) -> Call:
        p = case.p
        shape = tuple(p["shape"])
        # Per-token scales spread over two decades so that the normalisation is not the identity.
        spread = torch.exp(torch.randn((shape[0],) + (1,) * (len(shape) - 1), generator=g, dtype=torch.float64))
        x = (torch.randn(shape, generator=g, dtype=torch.float64) * spread).to(dtype_of(case.dtype))
        m = 1 if p["sizes"] is None else len(p["sizes"])
        weight = randn(g, (m, p["patterns"], shape[-1]), dtype_of(p["weight_dtype"]), 0.2)
        if p["flat"]:
            weight = weight.reshape(-1)
        out = None if p["out_dtype"] is None else dtype_of(p["out_dtype"])
        sizes = None if p["sizes"] is None else list(p["sizes"])
        return Call((x, weight), {"eps": p["eps"], "modality_sizes": sizes, "out_dtype": out})

    def layout(self, call: Call) -> dict[str, tuple[list[int], tuple[torch.dtype, ...]]]:
        x = call.args[0]
        return {"y": (list(x.shape), (call.kwargs["out_dtype"] or x.dtype,))}

    def invalid_calls(self, dtype: torch.dtype, other: torch.dtype, g: torch.Generator) -> dict[str, Call]:
        x = randn(g, (8, 16), dtype)
        weight = randn(g, (2, 1, 16), torch.float32)
        return {
            "modality sizes not summing to the tokens": Call((x, weight), {"modality_sizes": [3, 4]}),
            "weight of the wrong width": Call((x, weight[..., :8]), {"modality_sizes": [3, 5]}),
            "modality sizes as a tensor": Call((x, weight), {"modality_sizes": torch.tensor([3, 5])}),
        }

    def explain(self, opts: Mapping[str, Any], features: set[Feature]) -> dict[str, Any]:
        tokens, dt = opts["tokens"], opts["dtype"]
        out = opts["dtype_names"].get(opts["out_dtype"], opts["out_dtype"]) or dt
        if out not in {ck.dtype_name(d) for d in ck.FLOATS}:
            raise ExplainError(f"--out-dtype {opts['out_dtype']}: rmsnorm writes bfloat16, float16 or float32 "
                               "(the call raises for any other out_dtype)")
        return dict(tokens=tokens if tokens is not None else 4096, width=opts["width"],
                    num_modalities=opts["modalities"], num_patterns=opts["patterns"],
                    out_dtype=out)


SPEC = RMSNormSpec()
