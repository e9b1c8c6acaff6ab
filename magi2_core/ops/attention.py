"""The ``attention`` operator: packed variable-length attention with learned sinks.

Its one home: the public function, the typed problem key, validation (every argument checked before
any kernel runs, and once per call), the kernel Protocol, the ``torch.compile`` fake and the
acceptance rule (its conformance cases: :mod:`magi2_core.testing.op_cases.attention`). Validation
normalises the inputs:
int32 prefix sums on q's device, integer max lengths, the softmax scale, ``max(softcap, 0)`` and
``sinks`` as ``None`` or FP32 ``[S, Hq]`` with ``S >= 1``.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, Protocol, overload

import torch

from magi2_core import config
from magi2_core.contracts import _checks as checks
from magi2_core.contracts import acceptance as acc
from magi2_core.errors import InvalidDeviceError, InvalidDTypeError, InvalidShapeError, InvalidValueError
from magi2_core.model.kernel import SinkRescale
from magi2_core.model.problem import FEATURE_BIT, Feature
from magi2_core.ops._args import OPTIONAL_TENSOR, TENSOR, VALUE, Arg, Args, deterministic_arg, record
from magi2_core.ops._compiled import custom_op
from magi2_core.ops._lookup import cache_lookup
from magi2_core.ops._spec import OpSpec, forward_only
from magi2_core.selection import shadow as _shadow

__all__ = [
    "ACTIVATION_DTYPES",
    "ARGS",
    "SPEC",
    "AttentionCall",
    "AttentionKernel",
    "AttentionKey",
    "attention",
    "validate",
]

OP: Literal["attention"] = "attention"
ACTIVATION_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_GQA = FEATURE_BIT[Feature.GQA]


class AttentionKey(NamedTuple):
    """The typed problem of an attention call: what provider selection may depend on."""

    device: torch.device | str
    dtype: str
    out_dtype: None
    features: int  # OR of FEATURE_BIT values
    tokens: int
    tokens_k: int
    max_seqlen_q: int  # the longest query segment (host prefix sums) or the declared bound
    max_seqlen_k: int
    num_segments: int
    head_dim: int
    num_heads_q: int
    num_heads_kv: int


class AttentionCall(NamedTuple):
    """One validated attention call: what a provider receives, whole and frozen (the core API 2 ABI).

    Validation builds it once per call layout; providers, the ``torch.compile`` custom op and shadow
    verification receive the same record. Inputs are normalised: int32 prefix sums on q's device,
    Python int max lengths, the softmax scale resolved, ``softcap = max(softcap, 0)``, ``sinks`` ``None``
    or FP32 ``[S, Hq]`` with ``S >= 1``. The tensors come first: a repeated layout reuses the rest.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    sinks: torch.Tensor | None
    max_seqlen_q: int
    max_seqlen_k: int
    softmax_scale: float
    softcap: float
    sink_rescale: SinkRescale
    deterministic: bool
    return_lse: bool
    key: AttentionKey


# Prefix sums enter the call layout by value where validation reads their values (host ones, or device
# ones whose longest segment is not given), else by shape; self-attention passes one tensor for both,
# whose items cu_seqlens_q's already hold. Each device is read once (``:=``).
_CU_Q = (
    "{}.dtype, ({}_device := {}.device), {}.is_contiguous(), tuple({}.tolist()) if {}_device.type == 'cpu' or "
    "max_seqlen_q is None else {}.shape"
)
_CU_K = (
    "None if {} is cu_seqlens_q and (cu_seqlens_q_device.type == 'cpu' or max_seqlen_q is None or max_seqlen_k is "
    "not None) else ({}.dtype, ({}_device := {}.device), {}.is_contiguous(), tuple({}.tolist()) if "
    "{}_device.type == 'cpu' or max_seqlen_k is None else {}.shape)"
)

# The arguments of :func:`attention` (without ``provider``), declared once: see :mod:`magi2_core.ops._args`.
ARGS = Args(
    OP,
    (
        Arg("q", "torch.Tensor", "``[Tq, Hq, D]``, BF16, FP16 or FP32.", schema=torch.Tensor, layout=TENSOR),
        Arg(
            "k",
            "torch.Tensor",
            "``[Tk, Hkv, D]``, q's dtype and device; ``Hq`` a multiple of ``Hkv`` (GQA: query "
            "head h reads kv head ``h // (Hq / Hkv)``).",
            schema=torch.Tensor,
            layout=TENSOR,
        ),
        Arg("v", "torch.Tensor", "", schema=torch.Tensor, layout=TENSOR),
        Arg(
            "cu_seqlens_q",
            "torch.Tensor",
            "``[B+1]`` prefix sums of the segment lengths, from 0 to ``Tq`` "
            "(``Tk``), non-decreasing; any int dtype (int32 is what the kernels take), on the host or q's device.",
            schema=torch.Tensor,
            layout=_CU_Q,
        ),
        Arg("cu_seqlens_k", "torch.Tensor", "", schema=torch.Tensor, layout=_CU_K),
        Arg(
            "max_seqlen_q",
            "int | None",
            "the longest query (key) segment. Pass them when the prefix sums live on an "
            "accelerator: otherwise they are read back (one host sync) to derive them.",
            None,
            schema=int | None,
        ),
        Arg("max_seqlen_k", "int | None", "", None, schema=int | None),
        Arg(
            "softmax_scale", "float | None", "a finite positive float (None: ``1/sqrt(D)``).", None, schema=float | None
        ),
        Arg(
            "softcap",
            "float",
            "``cap·tanh(s/cap)`` on the scaled scores when positive; ``<= 0`` disables it.",
            0.0,
            schema=float,
            to_schema=float,
            feature=Feature.SOFTCAP,
        ),
        Arg(
            "sinks",
            "torch.Tensor | None",
            "``[S, Hq]`` FP32 (sink-major), on q's device: S extra softmax logits per "
            "query head that take probability mass without adding a value; never rounded to the activation dtype. "
            "MAGI-2 uses S = 1; None (or S = 0): no sink.",
            None,
            schema=torch.Tensor | None,
            layout=OPTIONAL_TENSOR,
            feature=Feature.SINKS,
        ),
        deterministic_arg(),
        Arg(
            "return_lse",
            "bool",
            "also return the log-sum-exp of each query row, sinks included.",
            False,
            compiled=True,
            layout=VALUE,
            feature=Feature.LSE,
        ),  # the custom op always returns it
        Arg(
            "sink_rescale",
            "SinkRescale",
            '``"fp32"`` (promote, rescale, cast once) or ``"activation"`` (the sink '
            "scale cast to q's dtype first, as upstream CUDA MAGI-2).",
            "fp32",
            schema=str,
            layout=VALUE,
        ),
    ),
)
_SINKS_AT = ARGS.names.index("sinks")
_TENSORS = 6  # the leading tensor fields of AttentionCall; a cache hit reuses the fields after them


class AttentionKernel(Protocol):
    """What an attention provider's kernel object is called with: one :class:`AttentionCall`."""

    def __call__(self, call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Return ``(o [Tq, Hq, D] in q.dtype, lse [Hq, Tq] FP32 or None)``; sinks already applied.

        ``lse`` is ``None`` unless ``call.return_lse``.
        """
        ...


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------
def _prefix_sums(arg: str, cu: object, device: torch.device) -> tuple[torch.Tensor, list[int] | None]:
    t = checks.tensor(OP, arg, cu)
    if t.dim() != 1 or t.numel() < 1:
        raise InvalidShapeError(OP, arg, "a 1-D prefix-sum tensor [B+1] with B >= 0", checks.describe(t))
    dtype = t.dtype
    if dtype is not torch.int32 and dtype is not torch.int64:
        checks.dtype_in(OP, arg, t, (torch.int32, torch.int64))  # raises, naming both
    where = t.device
    on_host = where.type == "cpu"
    if not on_host and where.type != device.type:
        raise InvalidDeviceError(OP, arg, f"on the host or on {device} like q", checks.describe(t))
    values = t.tolist() if on_host else None
    return _normalised(t, device), values


def _normalised(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if t.dtype is torch.int32 and t.device == device and t.is_contiguous():
        return t  # the common case: no conversion call on the hot path
    return t.to(device=device, dtype=torch.int32, non_blocking=True).contiguous()


def _check_values(arg: str, values: list[int], total: int, n_tokens_arg: str) -> int:
    if values[0] != 0:
        raise InvalidShapeError(OP, arg, "a prefix sum starting at 0", f"first value {values[0]}")
    if values[-1] != total:
        raise InvalidShapeError(
            OP, arg, f"a prefix sum ending at {n_tokens_arg}.shape[0] = {total}", f"last value {values[-1]}"
        )
    lengths = list(map(operator.sub, values[1:], values[:-1]))  # C-level loop
    if lengths and min(lengths) < 0:
        bad = next(i for i, n in enumerate(lengths) if n < 0)
        raise InvalidShapeError(OP, arg, "non-decreasing", f"{values[bad]} then {values[bad + 1]} at index {bad}")
    return max(lengths, default=0)


def _max_len(arg: str, given: int | None, derived: int | None) -> int:
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 0:
            raise InvalidShapeError(OP, arg, "a non-negative Python int or None", repr(given))
        if derived is not None and given < derived:
            raise InvalidShapeError(OP, arg, f">= the longest segment ({derived})", str(given))
        return given
    assert derived is not None
    return derived


def validate(
    q: object,
    k: object,
    v: object,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    *,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    softmax_scale: float | None,
    softcap: float,
    sinks: object,
    sink_rescale: str,
    deterministic: bool,
    return_lse: bool,
    compiling: bool,
) -> AttentionCall:
    """Check every argument (raising an input error that names it) and normalise the inputs."""
    q = checks.tensor(OP, "q", q)
    checks.with_data(OP, "q", q)
    k = checks.tensor(OP, "k", k)
    v = checks.tensor(OP, "v", v)
    dtype, device = q.dtype, q.device
    # One combined test for the common case; the detailed checks below name what is wrong.
    if not (
        q.dim() == k.dim() == v.dim() == 3
        and dtype in ACTIVATION_DTYPES
        and k.dtype is dtype
        and v.dtype is dtype
        and k.device == device
        and v.device == device
    ):
        for arg, t in (("q", q), ("k", k), ("v", v)):
            checks.rank(OP, arg, t, (3,), "[tokens, heads, head_dim]")
        checks.dtype_in(OP, "q", q, ACTIVATION_DTYPES)
        for arg, t in (("k", k), ("v", v)):
            if t.dtype != dtype:
                raise InvalidDTypeError(OP, arg, f"of q's dtype {checks.dtype_name(dtype)}", checks.describe(t))
        checks.same_device(OP, "q", q, k=k, v=v)
    tq, hq, d = q.shape
    tk, hkv, dk = k.shape
    if dk != d or v.shape[2] != d:
        raise InvalidShapeError(OP, "k/v", f"head_dim {d} like q", f"k {list(k.shape)}, v {list(v.shape)}")
    if tuple(v.shape[:2]) != (tk, hkv):
        raise InvalidShapeError(OP, "v", f"[{tk}, {hkv}, {d}] like k", checks.describe(v))
    if hkv == 0 or hq % hkv != 0:
        raise InvalidShapeError(OP, "k", f"a kv head count dividing q's {hq} heads (GQA)", f"{hkv} kv heads")
    cu_q, vals_q = _prefix_sums("cu_seqlens_q", cu_seqlens_q, device)
    cu_k, vals_k = _prefix_sums("cu_seqlens_k", cu_seqlens_k, device)
    if cu_q.numel() != cu_k.numel():
        raise InvalidShapeError(
            OP, "cu_seqlens_k", f"{cu_q.numel()} entries like cu_seqlens_q (same batch)", f"{cu_k.numel()} entries"
        )
    need_values = max_seqlen_q is None or max_seqlen_k is None or checks.device_value_checks()
    if need_values and vals_q is None:  # device prefix sums: one host sync, only when lengths were not given
        vals_q = cu_q.tolist()
    if need_values and vals_k is None:
        vals_k = cu_k.tolist()
    long_q = _check_values("cu_seqlens_q", vals_q, tq, "q") if vals_q is not None else None
    long_k = _check_values("cu_seqlens_k", vals_k, tk, "k") if vals_k is not None else None
    mq = _max_len("max_seqlen_q", max_seqlen_q, long_q)
    mk = _max_len("max_seqlen_k", max_seqlen_k, long_k)
    if softmax_scale is None:
        scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
    else:
        scale = checks.real(OP, "softmax_scale", softmax_scale, "a finite positive float or None")
        if not math.isfinite(scale) or scale <= 0:
            raise InvalidValueError(OP, "softmax_scale", "a finite positive float or None", repr(softmax_scale))
    cap = checks.real(OP, "softcap", softcap, "a finite float (<= 0 disables it)")
    if math.isnan(cap) or math.isinf(cap):
        raise InvalidValueError(OP, "softcap", "a finite float (<= 0 disables it)", repr(softcap))
    cap = max(cap, 0.0)
    sink_t: torch.Tensor | None = None
    if sinks is not None:
        sink_t = checks.tensor(OP, "sinks", sinks)
        if sink_t.dtype != torch.float32:
            raise InvalidDTypeError(
                OP, "sinks", "FP32 (sinks are never rounded to the activation dtype)", checks.describe(sink_t)
            )
        if sink_t.dim() != 2 or sink_t.shape[1] != hq:
            raise InvalidShapeError(OP, "sinks", f"[S, {hq}] (S sink logits per q head)", checks.describe(sink_t))
        checks.same_device(OP, "q", q, sinks=sink_t)
        checks.nan_free_parameter(OP, "sinks", sink_t)
        if sink_t.shape[0] == 0:
            sink_t = None
    if sink_rescale not in ("fp32", "activation"):
        raise InvalidValueError(OP, "sink_rescale", "'fp32' or 'activation'", repr(sink_rescale))
    call = AttentionCall(
        q,
        k,
        v,
        cu_q,
        cu_k,
        sink_t,
        mq,
        mk,
        scale,
        cap,
        sink_rescale,  # type: ignore[arg-type]
        bool(deterministic),
        bool(return_lse),
        None,  # type: ignore[arg-type]
    )
    mask = ARGS.features(call, compiling) | (_GQA if hq != hkv else 0)
    # Rules judge the true longest segments where the prefix sums are on the host; with device prefix
    # sums and max_seqlen_* given, they judge the declared bound (Resolution.explain says so).
    rq = mq if long_q is None else long_q
    rk = mk if long_k is None else long_k
    return call._replace(
        key=AttentionKey(device, checks.dtype_name(dtype), None, mask, tq, tk, rq, rk, cu_q.numel() - 1, d, hq, hkv)
    )


# ---------------------------------------------------------------------------------------------
# the public op
# ---------------------------------------------------------------------------------------------
class _Layout(NamedTuple):
    """A validated call layout: what a repeated call with the same layout reuses."""

    kernel: Any
    provider: str
    rest: tuple[Any, ...]  # the validated call's fields after its tensors (scalars and the key)
    drop_sinks: bool  # an empty [0, Hq] sinks tensor means no sinks
    convert: bool  # a prefix sum needs the int32-on-q's-device conversion
    recheck: bool  # host sinks: checked for NaN on every call (checks.nan_free_parameter says why)


def _make(kernel: Any, name: str, call: AttentionCall, args: tuple[Any, ...]) -> _Layout:
    """What a repeated call of this layout reuses (``args``: the declared arguments)."""
    host_sinks = call.sinks is not None and call.sinks.device.type == "cpu"
    return _Layout(
        kernel,
        name,
        call[_TENSORS:],
        args[_SINKS_AT] is not None and call.sinks is None,
        call.cu_seqlens_q is not args[3] or call.cu_seqlens_k is not args[4],
        host_sinks,
    )


def _recheck(hit: _Layout, sinks: torch.Tensor) -> None:
    checks.nan_free_parameter(OP, "sinks", sinks)


@overload
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    max_seqlen_q: int | None = ...,
    max_seqlen_k: int | None = ...,
    softmax_scale: float | None = ...,
    softcap: float = ...,
    sinks: torch.Tensor | None = ...,
    deterministic: bool | None = ...,
    return_lse: Literal[False] = ...,
    sink_rescale: SinkRescale = ...,
    provider: str | None = ...,
) -> torch.Tensor: ...
@overload
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    max_seqlen_q: int | None = ...,
    max_seqlen_k: int | None = ...,
    softmax_scale: float | None = ...,
    softcap: float = ...,
    sinks: torch.Tensor | None = ...,
    deterministic: bool | None = ...,
    return_lse: Literal[True],
    sink_rescale: SinkRescale = ...,
    provider: str | None = ...,
) -> tuple[torch.Tensor, torch.Tensor]: ...
@ARGS.public
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    softmax_scale: float | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    deterministic: bool | None = None,
    return_lse: bool = False,
    sink_rescale: SinkRescale = "fp32",
    provider: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen attention with learned sinks: ``o [Tq, Hq, D]`` (and ``lse [Hq, Tq]`` FP32).

    Non-causal and block-diagonal: each query attends to the keys of its own segment. T is a token
    count (the B segments of a batch one after another), H a head count, D the head dim.

    Returns:
        ``o [Tq, Hq, D]`` in q's dtype; with ``return_lse=True`` the pair ``(o, lse)``, ``lse``
        ``[Hq, Tq]`` FP32 (head-major).
    """
    if deterministic is None:
        deterministic = config.get("MAGI2_DETERMINISTIC")
    try:  # attribute reads, not getattr with a default: this runs on every call
        asks_grad = q.requires_grad or k.requires_grad or v.requires_grad or (sinks is not None and sinks.requires_grad)
    except AttributeError:  # not tensors: validation says which
        asks_grad = False
    if asks_grad and torch.is_grad_enabled():
        forward_only(OP, q=q, k=k, v=v, sinks=sinks)
    args = (
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale,
        softcap,
        sinks,
        deterministic,
        return_lse,
        sink_rescale,
    )
    if torch.compiler.is_compiling():
        o, lse = ARGS.compiled(args, provider)
        return (o, lse) if return_lse else o
    b = _bind(args, provider)
    if b.convert:
        cu_seqlens_q, cu_seqlens_k = _normalised(cu_seqlens_q, q.device), _normalised(cu_seqlens_k, q.device)
    if b.drop_sinks:
        sinks = None
    # one record per call, built without the NamedTuple's Python __new__ (concatenation: faster than *)
    call: AttentionCall = record(AttentionCall, (q, k, v, cu_seqlens_q, cu_seqlens_k, sinks) + b.rest)  # noqa: RUF005
    o, lse = _shadow.observed(SPEC, b.provider, call, b.kernel(call))
    return (o, lse) if return_lse else o


# ---------------------------------------------------------------------------------------------
# the spec: what the generic machinery asks of this op
# ---------------------------------------------------------------------------------------------
def _accept(
    problem: Any, got: Mapping[str, torch.Tensor], ref: Mapping[str, torch.Tensor], call: AttentionCall
) -> list[acc.Acceptance]:
    results = [acc.accept_attention(got["o"], ref["o"])]
    if "lse" in ref and "lse" in got:
        results.append(acc.accept_lse(got["lse"], ref["lse"], ref["o"].dtype))
    return results


SPEC: OpSpec[AttentionCall, AttentionKey] = OpSpec(ARGS, AttentionKey, validate, outputs=("o", "lse"), accept=_accept)
_bind: Callable[..., _Layout] = cache_lookup(SPEC, _make, value_checked=True, recheck=("sinks", _recheck))


def _fake(a: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    q = a["q"]
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


custom_op(SPEC, tuple[torch.Tensor, torch.Tensor], _fake)
