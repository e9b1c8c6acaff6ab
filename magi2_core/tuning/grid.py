"""The shapes ``magi2 tune`` measures: the default production grid, and ``--shapes FILE``.

A grid is a list of points, one op call each. Every point has an ``id`` (stable across runs: the
resumable session and the results name points by it) and builds its own inputs on a device.

``--shapes FILE`` is JSON: ``{"points": [...]}`` (or a bare list), each point an object with ``op``
and that op's sizes (the fields of :class:`AttentionShape`, :class:`ExpertsShape`,
:class:`RouteShape`, :class:`NormShape`; unknown keys are errors)::

    {"points": [
      {"op": "attention", "lengths": [8192, 8192, 8192, 8192], "sinks": true},
      {"op": "moe_experts", "tokens": 4096, "heads": 12},
      {"op": "moe_route", "tokens": 4096, "heads": 3},
      {"op": "rmsnorm", "shape": [14601, 24, 128], "out_dtype": "float32"}
    ]}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

import magi2_core as m2
from magi2_core.errors import InvalidValueError
from magi2_core.model.problem import OpName

__all__ = [
    "DEFAULT_GRID",
    "AttentionShape",
    "Built",
    "ExpertsShape",
    "NormShape",
    "RouteShape",
    "Shape",
    "default_grid",
    "load_shapes",
    "parse_shapes",
]

DType = Literal["bfloat16", "float16", "float32"]
_Strict = ConfigDict(frozen=True, extra="forbid")


@dataclass
class Built:
    """A point's inputs on a device: ``fn(*args, **kwargs, provider=...)`` is the op call."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def call(self, provider: str | None = None) -> Callable[[], object]:
        fn, args, kwargs = self.fn, self.args, self.kwargs
        return lambda: fn(*args, **kwargs, provider=provider)


def _lengths_label(lengths: Sequence[int]) -> str:
    if len(set(lengths)) == 1:
        return f"{lengths[0]}" + (f"x{len(lengths)}" if len(lengths) > 1 else "")
    return "+".join(str(n) for n in lengths)


def _dtype(name: str) -> Any:
    return getattr(torch, name)


def _generator(device: str, seed: int) -> Any:
    return torch.Generator(device=device).manual_seed(seed)


class AttentionShape(BaseModel):
    """Non-causal varlen attention over segments of ``lengths`` (queries = keys)."""

    model_config = _Strict

    op: Literal["attention"]
    lengths: tuple[Annotated[int, Field(ge=1)], ...] = Field(min_length=1)
    heads_q: int = Field(24, ge=1)
    heads_kv: int | None = Field(None, ge=1, description="default: heads_q")
    head_dim: int = Field(128, ge=1)
    sinks: bool = False
    deterministic: bool = False
    dtype: DType = "bfloat16"

    @model_validator(mode="after")
    def _gqa(self) -> AttentionShape:
        if self.heads_q % (self.heads_kv or self.heads_q):
            raise ValueError(f"heads_q {self.heads_q} must be a multiple of heads_kv {self.heads_kv}")
        return self

    @property
    def id(self) -> str:
        kv = self.heads_kv or self.heads_q
        heads = f"{self.heads_q}" + (f"/{kv}" if kv != self.heads_q else "")
        extra = "".join(f" {w}" for w, on in (("sinks", self.sinks), ("deterministic", self.deterministic)) if on)
        return f"attention {heads}x{self.head_dim} [{_lengths_label(self.lengths)}] {self.dtype}{extra}"

    def build(self, device: str, seed: int = 0) -> Built:
        g, dt = _generator(device, seed), _dtype(self.dtype)
        t, kv = sum(self.lengths), self.heads_kv or self.heads_q
        q = torch.randn(t, self.heads_q, self.head_dim, device=device, generator=g).to(dt)
        k, v = (torch.randn(t, kv, self.head_dim, device=device, generator=g).to(dt) for _ in range(2))
        cu = torch.tensor([0, *torch.tensor(self.lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
        mx = max(self.lengths)
        kwargs: dict[str, Any] = {"max_seqlen_q": mx, "max_seqlen_k": mx, "deterministic": self.deterministic}
        if self.sinks:
            kwargs["sinks"] = torch.randn(1, self.heads_q, device=device, generator=g).float() + 4.0
        return Built(m2.attention, (q, k, v, cu, cu), kwargs)


class ExpertsShape(BaseModel):
    """The fused MoE experts at ``tokens`` tokens and ``heads`` local heads, routed top-``top_k``."""

    model_config = _Strict

    op: Literal["moe_experts"]
    tokens: int = Field(ge=1)
    heads: int = Field(3, ge=1)
    experts: int = Field(256, ge=1, description="experts per head")
    top_k: int = Field(6, ge=1)
    hidden: int = Field(256, ge=1)
    intermediate: int = Field(1280, ge=1)
    deterministic: bool = False
    dtype: DType = "bfloat16"

    @model_validator(mode="after")
    def _k(self) -> ExpertsShape:
        if self.top_k > self.experts:
            raise ValueError(f"top_k {self.top_k} must be at most experts {self.experts}")
        return self

    @property
    def id(self) -> str:
        det = " deterministic" if self.deterministic else ""
        return (
            f"moe_experts T{self.tokens} H{self.heads} E{self.experts} k{self.top_k} d{self.hidden} "
            f"I{self.intermediate} {self.dtype}{det}"
        )

    def build(self, device: str, seed: int = 0) -> Built:
        g, dt = _generator(device, seed), _dtype(self.dtype)
        t, h, e, k, d, i = self.tokens, self.heads, self.experts, self.top_k, self.hidden, self.intermediate
        x = torch.randn(t, h, d, device=device, generator=g).to(dt)
        # distinct experts per (head, token): the top-k of random scores, as the router gives
        idx = torch.rand(h, t, e, device=device, generator=g).topk(k, dim=-1).indices
        probs = torch.rand(h, t, k, device=device, generator=g)
        w_gate, w_up = ((torch.randn(h * e, d, i, device=device, generator=g) * d**-0.5).to(dt) for _ in range(2))
        w_down = (torch.randn(h * e, i, d, device=device, generator=g) * i**-0.5).to(dt)
        # Laid out as a model lays them out at load time (prepare_moe_weights): the plans are timed on the
        # weights they serve in production. The checkpoint views of the layout are read in place by any provider.
        w = m2.prepare_moe_weights(w_gate, w_up, w_down)
        return Built(m2.moe_experts, (x, probs, idx, w.w_gate, w.w_up, w.w_down), {"deterministic": self.deterministic})


class RouteShape(BaseModel):
    """The MoE router (scores, biased top-k, weights) at ``tokens`` tokens and ``heads`` local heads."""

    model_config = _Strict

    op: Literal["moe_route"]
    tokens: int = Field(ge=1)
    heads: int = Field(3, ge=1)
    experts: int = Field(256, ge=1, description="experts per head")
    top_k: int = Field(6, ge=1)
    hidden: int = Field(256, ge=1)
    dtype: DType = "bfloat16"

    @property
    def id(self) -> str:
        return f"moe_route T{self.tokens} H{self.heads} E{self.experts} k{self.top_k} d{self.hidden} {self.dtype}"

    def build(self, device: str, seed: int = 0) -> Built:
        g = _generator(device, seed)
        t, h, e, d = self.tokens, self.heads, self.experts, self.hidden
        x = torch.randn(t, h, d, device=device, generator=g).to(_dtype(self.dtype))
        router = torch.randn(h * e, d, device=device, generator=g) * d**-0.5
        bias = torch.randn(h * e, device=device, generator=g) * 0.01
        return Built(m2.moe_route, (x, router, bias), {"top_k": self.top_k})


class NormShape(BaseModel):
    """Multi-modality RMSNorm of ``x`` of ``shape`` (tokens first, width last)."""

    model_config = _Strict

    op: Literal["rmsnorm"]
    shape: tuple[Annotated[int, Field(ge=1)], ...] = Field(min_length=2)
    modality_sizes: tuple[Annotated[int, Field(ge=1)], ...] | None = None
    out_dtype: DType | None = None
    dtype: DType = "bfloat16"

    @model_validator(mode="after")
    def _sizes(self) -> NormShape:
        if self.modality_sizes is not None and sum(self.modality_sizes) != self.shape[0]:
            raise ValueError(f"modality_sizes {list(self.modality_sizes)} must add up to the tokens {self.shape[0]}")
        return self

    @property
    def id(self) -> str:
        mods = f" modalities {'+'.join(map(str, self.modality_sizes))}" if self.modality_sizes else ""
        out = f" -> {self.out_dtype}" if self.out_dtype else ""
        return f"rmsnorm {'x'.join(map(str, self.shape))} {self.dtype}{out}{mods}"

    def build(self, device: str, seed: int = 0) -> Built:
        g = _generator(device, seed)
        m, d = len(self.modality_sizes or (0,)), self.shape[-1]
        x = torch.randn(*self.shape, device=device, generator=g).to(_dtype(self.dtype))
        weight = torch.randn(m, 1, d, device=device, generator=g) * 0.2
        kwargs: dict[str, Any] = {}
        if self.modality_sizes:
            kwargs["modality_sizes"] = list(self.modality_sizes)
        if self.out_dtype:
            kwargs["out_dtype"] = _dtype(self.out_dtype)
        return Built(m2.rmsnorm, (x, weight), kwargs)


Shape = Annotated[AttentionShape | ExpertsShape | RouteShape | NormShape, Field(discriminator="op")]
_SHAPES: TypeAdapter[list[Shape]] = TypeAdapter(list[Shape])

_LONG = ((32768,), (8192,) * 4, (14601,) * 2)
_SHORT = ((512,), (2048,), (256,) * 16, (1024,) * 8)
_MOE_TOKENS = (512, 4096, 14601)


def default_grid() -> list[Shape]:
    """The production grid (MAGI-2 sizes): attention 24 heads x 128, long packs ([32768], [8192]x4,
    [14601]x2) and short ones, each plain, with a sink and deterministic, plus short GQA (24/8 heads);
    the MoE experts and router at 512, 4096 and 14601 tokens x 3 and 12 heads (256 experts, top-6,
    d 256, I 1280), the experts deterministic too at 4096 tokens; the four RMSNorm shapes of the model."""
    out: list[Shape] = []
    for lengths in (*_LONG, *_SHORT):
        out += [
            AttentionShape(op="attention", lengths=lengths),
            AttentionShape(op="attention", lengths=lengths, sinks=True),
            AttentionShape(op="attention", lengths=lengths, deterministic=True),
        ]
    out += [AttentionShape(op="attention", lengths=lengths, heads_kv=8) for lengths in ((512,), (256,) * 16)]
    for tokens in _MOE_TOKENS:
        for heads in (3, 12):
            out.append(ExpertsShape(op="moe_experts", tokens=tokens, heads=heads))
    out += [ExpertsShape(op="moe_experts", tokens=4096, heads=h, deterministic=True) for h in (3, 12)]
    out += [RouteShape(op="moe_route", tokens=t, heads=h) for t in _MOE_TOKENS for h in (3, 12)]
    out += [
        NormShape(op="rmsnorm", shape=(65536, 3072), modality_sizes=(40960, 16384, 8192)),
        NormShape(op="rmsnorm", shape=(65536, 3072)),
        NormShape(op="rmsnorm", shape=(14601, 24, 128), out_dtype="float32"),
        NormShape(op="rmsnorm", shape=(16384, 12288), out_dtype="float32"),
    ]
    return out


DEFAULT_GRID = "the production grid (magi2_core.tuning.grid.default_grid)"


def parse_shapes(data: Any, origin: str) -> list[Shape]:
    """Points from decoded JSON (``{"points": [...]}`` or a list); errors name ``origin``, the point and the field."""
    items = data.get("points") if isinstance(data, dict) else data
    if isinstance(data, dict) and set(data) - {"points"}:
        raise InvalidValueError(
            "tune", "--shapes", '{"points": [...]} (no other keys)', f"{origin}: keys {sorted(data)}"
        )
    if not isinstance(items, list) or not items:
        raise InvalidValueError(
            "tune", "--shapes", 'a non-empty list of points, or {"points": [...]}', f"{origin}: {type(items).__name__}"
        )
    try:
        points = _SHAPES.validate_python(items)
    except ValidationError as exc:
        problems = "; ".join(
            f"points[{err['loc'][0]}]" + "".join(f".{p}" for p in err["loc"][1:]) + f": {err['msg']}"
            for err in exc.errors()
        )
        known = "attention, moe_experts, moe_route, rmsnorm"
        raise InvalidValueError(
            "tune",
            "--shapes",
            f"points with op one of {known} and that op's fields (docs/tuning.md)",
            f"{origin}: {problems}",
        ) from None
    ids = [p.id for p in points]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise InvalidValueError("tune", "--shapes", "distinct points", f"{origin}: repeated {dup}")
    return points


def load_shapes(path: str | Path) -> list[Shape]:
    """Points from a ``--shapes`` JSON file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidValueError("tune", "--shapes", "a readable JSON file", f"{path}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidValueError("tune", "--shapes", "a JSON file", f"{path}: not JSON: {exc}") from None
    return parse_shapes(data, str(path))


def select_ops(points: Sequence[Shape], ops: Sequence[OpName] | None) -> list[Shape]:
    """The points of ``ops`` (all when ``None``)."""
    return [p for p in points if ops is None or p.op in ops]
