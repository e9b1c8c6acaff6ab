"""vllm-omni's head-routed MoE layer, served by :func:`magi2_core.moe_route` and :func:`magi2_core.moe_experts`.

MAGI-2 splits each token's hidden state into H heads of width d; every head routes over its own bank
of E experts. The parameters keep vllm-omni 0.30.0's names, shapes and dtypes (the released
checkpoint's), with the flattened ``(head, expert)`` axis first:

========================  ================  =====================================================
``gate``                  FP32 [Hl·E, d]    router weight
``W_gate`` / ``W_up``     [Hl·E, d, I]      expert GEMM1 (params dtype, BF16 in the release)
``W_down``                [Hl·E, I, d]      expert GEMM2
``router.expert_bias``    FP32 [Hl·E]       selection bias ("main")
``router.expert_bias_ema`` FP32 [Hl·E]      selection bias, moving average ("ema", the default)
========================  ================  =====================================================

``MAGI2_ROUTER_BIAS_SOURCE`` (``ema`` | ``main``) picks the bias, read on every forward as vllm-omni
reads it (a value that is neither raises ``ConfigError`` naming the variable, where vllm-omni takes it
as ``ema``). Expert parallelism shards the heads: each rank holds
``Hl = ceil(H / EP)`` heads' rows (:func:`magi2_core.distributed.ep_slice`); heads past H are zero
"phantom" heads that are never computed.

The expert weights are laid out for the provider that serves them
(:func:`magi2_core.prepare_moe_weights`) when the layer is built on, loaded on or moved to an
accelerator. ``W_gate``/``W_up``/``W_down`` then become views of the prepared storage, so vllm-omni's
loader, which copies the checkpoint into the parameters in place, fills the prepared layout directly
and no second copy exists. The parameters are the only owners of that storage: the layer keeps the
layout's geometry, not its tensors, so whatever frees the parameters (layer-wise offloading) frees
the prepared bank too. A loader or offloader that re-seats a parameter (``param.data = ...``) is
noticed on the next forward, which lays the weights out again. Weights on the CPU keep the
checkpoint layout: there they are a host copy (what layer-wise offloading streams to the device).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist
from torch import nn

from magi2_core import ops
from magi2_core.contracts.moe import ScoreFunc
from magi2_core.contracts.moe_weights import CHECKPOINT, PreparedMoEWeights
from magi2_core.distributed import ep_head_counts, ep_local_heads, ep_plan, ep_slice
from magi2_core.errors import InvalidShapeError, InvalidValueError
from magi2_core.integrations.vllm_omni.settings import router_bias_source
from magi2_core.selection.registry import REFERENCE

__all__ = ["EPGroup", "Magi2MultiHeadMoE", "Magi2MultiHeadMoEConfig", "MoEConfigLike", "ParallelGroupLike"]

_OP = "Magi2MultiHeadMoE"
# Devices whose weights are a host copy, kept in the checkpoint layout: layer-wise offloading streams
# them to the device that computes, where they are laid out for its provider.
HOST_DEVICE_TYPES = frozenset({"cpu"})


class MoEConfigLike(Protocol):
    """The fields of vllm-omni's ``Magi2MultiHeadMoEConfig`` the layer reads (either class works)."""

    @property
    def hidden_size(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    @property
    def expert_intermediate_size(self) -> int: ...
    @property
    def params_dtype(self) -> torch.dtype: ...
    @property
    def score_func(self) -> str: ...
    @property
    def route_norm(self) -> bool: ...
    @property
    def route_scale(self) -> float: ...


@dataclass(frozen=True)
class Magi2MultiHeadMoEConfig:
    """Same fields and defaults as vllm-omni 0.30.0's config of the same name (the model passes
    ``route_scale=4.9``; the dataclass default is 1.0 there too)."""

    hidden_size: int
    num_heads: int
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    params_dtype: torch.dtype
    score_func: str = "sigmoid"
    route_norm: bool = True
    route_scale: float = 1.0


class ParallelGroupLike(Protocol):
    """vllm-omni's ``Magi2ParallelGroup``: the EP process group and this rank's place in it.

    ``replicated_sequence``: every rank already holds all tokens for its own heads (tensor
    parallelism), so the layer computes its heads in place with no token exchange.
    """

    @property
    def group(self) -> dist.ProcessGroup | None: ...
    @property
    def world_size(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def replicated_sequence(self) -> bool: ...


@dataclass(frozen=True)
class EPGroup:
    """A :class:`ParallelGroupLike` for use outside vllm-omni (the default is one rank, no EP)."""

    group: dist.ProcessGroup | None = None
    world_size: int = 1
    rank: int = 0
    replicated_sequence: bool = False


def _default_ep_group() -> ParallelGroupLike:
    # Inside vllm-omni the layer must use the group vllm-omni's own MoE would use (TP when TP > 1,
    # otherwise the Ulysses group); outside it there is no expert parallelism unless asked for.
    if importlib.util.find_spec("vllm_omni") is None:
        return EPGroup()
    parallel = importlib.import_module("vllm_omni.diffusion.models.magi2.parallel")
    return cast(ParallelGroupLike, parallel.get_magi2_ep_group())


class _StandsIn(type):
    """``isinstance(obj, cls)`` also holds for instances of ``cls.stands_in_for``.

    The plugin binds the layer class to the name vllm-omni's model code builds its MoE layers with;
    ``load_weights`` reads the same name in its isinstance checks, and a model built before the swap
    holds vllm-omni's own layers, which must still be found there.
    """

    stands_in_for: tuple[type, ...] = ()

    def __instancecheck__(cls, instance: object) -> bool:
        return type.__instancecheck__(cls, instance) or isinstance(instance, cls.stands_in_for)


@dataclass(frozen=True)
class _View:
    """One tensor of a prepared layout as a view of a parameter's storage (offset relative to it)."""

    param: int  # index into (W_gate, W_up, W_down)
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


# What the prepared views depend on: each parameter's address and strides (and the bank's dtype and
# device). Two live storages never overlap, so equal addresses and strides mean the views still
# cover exactly the parameters' elements, whichever allocation holds them.
_Key = tuple[object, ...]


def _key(params: tuple[torch.Tensor, ...]) -> _Key:
    return (params[0].dtype, params[0].device, *((p.data_ptr(), p.stride()) for p in params))


@dataclass(frozen=True)
class _Layout:
    """A prepared layout, kept as geometry: the parameters stay the only owners of its storage."""

    provider: str
    layout: str
    views: tuple[_View, ...]
    key: _Key

    @classmethod
    def of(cls, prepared: PreparedMoEWeights, params: tuple[torch.Tensor, ...]) -> _Layout:
        views = []
        for i, t in enumerate(prepared.tensors):
            owner = next((j for j, p in enumerate(params) if _same_storage(p, t)), None)
            if owner is None:
                raise InvalidValueError(
                    f"{_OP}.prepare_weights",
                    f"the {prepared.layout!r} tensor {i} of provider {prepared.provider!r}",
                    "a view of the storage of W_gate, W_up or W_down (which the layer re-seats onto it)",
                    "a tensor of its own, which the layer would have to keep alive beside the parameters",
                )
            offset = int(t.storage_offset()) - int(params[owner].storage_offset())
            views.append(_View(owner, tuple(t.shape), t.stride(), offset))
        return cls(prepared.provider, prepared.layout, tuple(views), _key(params))

    def weights(self, params: tuple[torch.Tensor, ...]) -> PreparedMoEWeights:
        """The prepared weights as fresh views of the parameters (valid while ``key`` holds)."""
        tensors = tuple(
            params[v.param].as_strided(v.size, v.stride, params[v.param].storage_offset() + v.offset)
            for v in self.views
        )
        w_gate, w_up, w_down = params  # the parameters are the layout's checkpoint views
        return PreparedMoEWeights(self.provider, self.layout, tensors, w_gate, w_up, w_down)


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.device == b.device and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class Magi2MultiHeadMoE(nn.Module, metaclass=_StandsIn):
    """Checkpoint-compatible with vllm-omni 0.30.0's ``mh_moe.Magi2MultiHeadMoE``.

    ``forward(x [T, H·d]) -> [T, H·d]`` (TP layout: ``[T, Hl·d]``, this rank's heads only). Routing
    and experts resolve like any magi2-core call (``magi2 explain moe_experts`` shows the choice);
    ``MAGI2_DETERMINISTIC=1`` asks for the deterministic expert schedule. The router weight and
    biases are read in FP32 whatever their dtype (``.to(torch.bfloat16)`` of the layer, or of a module
    holding it, casts them), as vllm-omni does.
    """

    _EP_SHARDED_PARAMETER_NAMES = frozenset(
        {"gate", "W_gate", "W_up", "W_down", "router.expert_bias", "router.expert_bias_ema"}
    )

    def __init__(
        self,
        config: MoEConfigLike,
        *,
        ep_group: ParallelGroupLike | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if config.hidden_size % config.num_heads:
            raise InvalidValueError(
                _OP, "config.hidden_size", f"a multiple of num_heads = {config.num_heads}", str(config.hidden_size)
            )
        if config.score_func not in ("sigmoid", "softmax"):
            raise InvalidValueError(_OP, "config.score_func", "'sigmoid' or 'softmax'", repr(config.score_func))
        self.config = config
        self.num_heads = config.num_heads
        self.num_experts = config.num_experts
        self.top_k = config.top_k
        self.d_head = config.hidden_size // config.num_heads
        self.d_expert = config.expert_intermediate_size
        self.ep_group = ep_group if ep_group is not None else _default_ep_group()
        world, rank = self.ep_group.world_size, self.ep_group.rank
        self.local_num_heads = ep_local_heads(self.num_heads, world)
        self.padded_num_heads = self.local_num_heads * world
        self.ep_pad_heads = self.padded_num_heads - self.num_heads
        self.local_flatten_num_experts = self.local_num_heads * self.num_experts
        self.local_head_start = rank * self.local_num_heads
        self.has_real_moe_heads = self.local_head_start < self.num_heads
        # Only the real heads' rows are ever computed; phantom rows stay zero and idle.
        self.real_local_heads = ep_head_counts(self.num_heads, world)[rank]
        self._real_rows = self.real_local_heads * self.num_experts

        f, d, i = self.local_flatten_num_experts, self.d_head, self.d_expert
        wdt = config.params_dtype
        self.gate = nn.Parameter(torch.empty(f, d, dtype=torch.float32, device=device))
        self.W_gate = nn.Parameter(torch.empty(f, d, i, dtype=wdt, device=device))
        self.W_up = nn.Parameter(torch.empty(f, d, i, dtype=wdt, device=device))
        self.W_down = nn.Parameter(torch.empty(f, i, d, dtype=wdt, device=device))
        self.router = nn.Module()
        # Checkpoint entries, so Parameters (not buffers): vllm-omni's mmap loader binds parameters.
        self.router.expert_bias = nn.Parameter(torch.zeros(f, dtype=torch.float32, device=device), requires_grad=False)
        self.router.expert_bias_ema = nn.Parameter(
            torch.zeros(f, dtype=torch.float32, device=device), requires_grad=False
        )
        for name in self._EP_SHARDED_PARAMETER_NAMES:
            # vllm-omni's direct-mmap loader slices each checkpoint tensor through this hook.
            self.get_parameter(name).mmap_weight_transform = self.ep_slice  # type: ignore[attr-defined]
        self._layout: _Layout | None = None
        self.prepare_weights()
        self.register_load_state_dict_post_hook(_prepare_after_load)  # type: ignore[no-untyped-call]
        self._register_state_dict_hook(_checkpoint_layout)  # type: ignore[no-untyped-call]

    def _experts(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.W_gate.detach(), self.W_up.detach(), self.W_down.detach()

    def prepare_weights(self) -> PreparedMoEWeights | None:
        """Lay ``W_gate``/``W_up``/``W_down`` out for the provider that serves them, in their place.

        Runs by itself at construction, after ``load_state_dict``, after ``.to()`` and whenever a
        forward finds a parameter re-seated; in-place updates need no call. On the CPU
        (:data:`HOST_DEVICE_TYPES`) the weights keep the checkpoint layout, for the reference.
        Returns the real heads' prepared weights, or None on the meta device (nothing to lay out
        until the weights exist).
        """
        if self.W_gate.device.type == "meta":
            self._layout = None
            return None
        if self.W_gate.device.type in HOST_DEVICE_TYPES:
            prepared = PreparedMoEWeights.from_layout(REFERENCE, CHECKPOINT, self._experts())
        else:
            prepared = ops.prepare_moe_weights(self.W_gate, self.W_up, self.W_down)
        if prepared.layout != CHECKPOINT:
            # The parameters (same objects) now live on the prepared storage as views of it: the old
            # tensors are freed, so no second copy of gate/up stays alive.
            self.W_gate.data, self.W_up.data, self.W_down.data = prepared.w_gate, prepared.w_up, prepared.w_down
        self._layout = _Layout.of(prepared, self._experts())
        return self._real(prepared)

    def prepared_weights(self) -> PreparedMoEWeights:
        """The prepared expert weights the forward uses (of the real heads' rows), laid out again
        first if a parameter was re-seated since. Fresh views of the parameters on every call:
        whoever holds them keeps the parameters' storage alive."""
        experts = self._experts()
        layout = self._current_layout(experts)
        if layout is not None:
            return self._real(layout.weights(experts))
        prepared = self.prepare_weights()
        if prepared is None:
            raise InvalidValueError(_OP, "weights", "materialised (not on the meta device)", "meta tensors")
        return prepared

    def _current_layout(self, experts: tuple[torch.Tensor, ...]) -> _Layout | None:
        """The layout, if every parameter is still where it was made."""
        layout = self._layout
        return layout if layout is not None and _key(experts) == layout.key else None

    def _real(self, prepared: PreparedMoEWeights) -> PreparedMoEWeights:
        if self._real_rows == self.local_flatten_num_experts:
            return prepared
        # Phantom heads' rows are never computed: views of the real rows only (dim 0 is the
        # flattened (head, expert) axis in every layout).
        return PreparedMoEWeights.from_layout(
            prepared.provider, prepared.layout, tuple(t[: self._real_rows] for t in prepared.tensors)
        )

    def _refresh(self) -> None:
        if self._current_layout(self._experts()) is None:
            self.prepare_weights()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Magi2MultiHeadMoE:
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        self._refresh()  # a move or cast makes new, plain tensors: lay them out again
        return self

    def ep_slice(self, checkpoint_tensor: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a full ``[H·E, ...]`` checkpoint tensor (already-local tensors pass).

        A rank whose rows are all real gets a view (an mmap-backed tensor stays unmaterialised);
        a rank with phantom heads gets a zero-padded copy.
        """
        rows = checkpoint_tensor.shape[0] if checkpoint_tensor.dim() else -1
        if rows == self.local_flatten_num_experts:
            return checkpoint_tensor
        full = self.num_heads * self.num_experts
        if rows != full:
            raise InvalidShapeError(
                "Magi2MultiHeadMoE.ep_slice",
                "checkpoint_tensor",
                f"dim 0 of {full} (all heads x experts) or {self.local_flatten_num_experts} (this rank's)",
                f"shape {list(checkpoint_tensor.shape)}",
            )
        start = self.local_head_start * self.num_experts
        if start + self.local_flatten_num_experts <= full:
            return checkpoint_tensor.narrow(0, start, self.local_flatten_num_experts)
        return ep_slice(
            checkpoint_tensor, self.ep_group.rank, self.ep_group.world_size, self.num_heads, self.num_experts
        )

    def _router_bias(self) -> torch.Tensor:
        name = "expert_bias" if router_bias_source() == "main" else "expert_bias_ema"
        return cast(torch.Tensor, getattr(self.router, name))

    def _rows(self, t: torch.Tensor) -> torch.Tensor:
        return t if self._real_rows == t.shape[0] else t[: self._real_rows]

    # -- routing: the router parameter itself (the fused router splits it in registers: no derived copy) --
    def _local_forward(self, x_heads: torch.Tensor) -> torch.Tensor:
        """Route and run this rank's real heads: ``[T, real_local_heads, d]`` -> same shape."""
        if x_heads.shape[0] == 0:
            return torch.empty_like(x_heads)
        probs, idx = ops.moe_route(
            x_heads,
            self._rows(self.gate).float(),
            self._rows(self._router_bias()).float(),
            top_k=self.top_k,
            route_scale=self.config.route_scale,
            route_norm=self.config.route_norm,
            score_func=cast(ScoreFunc, self.config.score_func),
        )
        return ops.moe_experts(x_heads, probs, idx, self.prepared_weights())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, H·d]`` -> ``[T, H·d]``; under tensor parallelism ``[T, Hl·d]`` -> ``[T, Hl·d]``."""
        if self.ep_group.world_size > 1 and self.ep_group.replicated_sequence:
            width = self.local_num_heads * self.d_head
            if x.shape[-1] != width:
                raise InvalidShapeError(
                    _OP, "x", f"[tokens, {width}] (this TP rank's {self.local_num_heads} heads)", f"{list(x.shape)}"
                )
            local = x.reshape(-1, self.local_num_heads, self.d_head)
            if self.real_local_heads == self.local_num_heads:
                return self._local_forward(local).reshape(-1, width)
            out = torch.zeros_like(local)
            if self.real_local_heads:
                out[:, : self.real_local_heads] = self._local_forward(local[:, : self.real_local_heads].contiguous())
            return out.reshape(-1, width)

        x_heads = x.reshape(-1, self.num_heads, self.d_head)
        if self.ep_group.world_size == 1:
            return self._local_forward(x_heads).reshape(-1, self.num_heads * self.d_head)
        plan = ep_plan(self.num_heads, x_heads.shape[0], group=self.ep_group.group, device=x.device)
        mine = plan.scatter_heads(x_heads)  # all tokens, this rank's real heads
        y = self._local_forward(mine) if plan.local_heads else mine
        return plan.gather_heads(y).reshape(-1, self.num_heads * self.d_head)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads} (local {self.local_num_heads}, real {self.real_local_heads}), "
            f"experts={self.num_experts}, top_k={self.top_k}, d={self.d_head}, I={self.d_expert}, "
            f"ep={self.ep_group.rank}/{self.ep_group.world_size}"
        )


def _prepare_after_load(module: nn.Module, _incompatible: object) -> None:
    assert isinstance(module, Magi2MultiHeadMoE)
    module._refresh()  # a plain load copied into the prepared views; assign=True replaced them


def _checkpoint_layout(module: nn.Module, state: dict[str, Any], prefix: str, _meta: Mapping[str, Any]) -> None:
    # W_gate/W_up may be strided views of a packed bank; a checkpoint holds plain tensors. With
    # keep_vars=True the entries are the Parameters themselves, which vllm-omni's load_weights fills
    # in place through copy_: those must stay the parameters, not copies.
    for name in ("W_gate", "W_up", "W_down"):
        t = state.get(prefix + name)
        if isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter) and not t.is_contiguous():
            state[prefix + name] = t.contiguous()
