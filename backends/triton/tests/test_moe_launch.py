"""Each one-kernel expert launcher passes its operands where its kernel declares them, on any host.

The Gluon kernels run only on a Hopper GPU, so on the CPU their launches are recorded instead of run:
the kernel objects are swapped for recorders and each recorded positional argument is checked against
the parameter of that name in the real kernel's signature (the kernel modules import without a GPU).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from magi2_backend_triton.moe import fused, gluon, kernels, kernels_tma, tma
from magi2_backend_triton.moe.align import ExpertLists, RouteBuffers
from magi2_backend_triton.moe.operands import Operands
from magi2_backend_triton.moe.tiles import Launch, SliceTile

T, HEADS, D, INTER, EXPERTS, TOPK = 8, 2, 32, 96, 4, 2
TILE = SliceTile(128, 32, 8, 3)


class Recorder:
    """A kernel object whose launch records ``(grid, args, kwargs)``."""

    def __init__(self, names: list[str]) -> None:
        self.arg_names = names
        self.launches: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.launches.append((grid, args, kwargs))

        return launch


@pytest.fixture
def recorders(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Recorder]]:
    mods = gluon._kernels()
    if isinstance(mods, str):
        pytest.skip(mods)
    real = {
        "gluon": mods[0].fused_expert_gluon_kernel,
        "gluon_routed": mods[0].fused_expert_gluon_routed_kernel,
        "gluon_ws": mods[1].fused_expert_gluon_ws_kernel,
        "tma": kernels_tma.fused_expert_tma_kernel,
        "one_kernel": kernels.fused_expert_kernel,
    }
    rec = {name: Recorder(list(k.arg_names)) for name, k in real.items()}
    fake = types.SimpleNamespace(
        fused_expert_gluon_kernel=rec["gluon"],
        fused_expert_gluon_routed_kernel=rec["gluon_routed"],
        fused_expert_gluon_ws_kernel=rec["gluon_ws"],
    )
    monkeypatch.setattr(gluon, "_checked_kernels", lambda *a: fake)
    monkeypatch.setattr(gluon, "_descriptors", lambda *a: ("w13 descriptor", "down descriptor"))
    monkeypatch.setattr(gluon, "_sm_count", lambda device: 132)
    monkeypatch.setattr(tma, "tma_unsupported_reason", lambda device: None)
    monkeypatch.setattr(tma, "fused_expert_tma_kernel", rec["tma"])
    monkeypatch.setattr(tma, "TensorDescriptor", types.SimpleNamespace(from_tensor=lambda t, block: f"{block}"))
    monkeypatch.setattr(fused, "fused_expert_kernel", rec["one_kernel"])
    yield rec


def _by_name(rec: Recorder) -> dict[str, Any]:
    ((_, args, _),) = rec.launches
    assert len(args) <= len(rec.arg_names)
    return dict(zip(rec.arg_names, args, strict=False))


def test_every_launcher_passes_each_operand_to_its_parameter(recorders: dict[str, Recorder]) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, HEADS, D, generator=g)  # strides (64, 32, 1): the token and head strides differ
    w13 = torch.randn(EXPERTS, 2 * INTER, D, generator=g)
    wd = torch.randn(EXPERTS, INTER, D, generator=g)
    probs = torch.rand(HEADS * T * TOPK, generator=g)
    routed = torch.empty(HEADS * T * TOPK, D)
    bufs = RouteBuffers.allocate(64, 16, EXPERTS, torch.device("cpu"))
    lists = ExpertLists.allocate(EXPERTS, T * TOPK, torch.device("cpu"))
    w_strides = (w13.stride(0), w13.stride(2), 2 * w13.stride(1))
    ops = Operands(x, w13, w13[:, 1:, :], w13, wd, w_strides, probs, routed, TOPK, False, False)
    for variant in ("gluon", "gluon_ws", "tma", "one_kernel"):
        fused._LAUNCHERS[variant](ops, Launch(variant, "atomic", TILE, None, True, True), bufs)
    fused._LAUNCHERS["gluon_routed"](ops, Launch("gluon_routed", "lists", TILE, None, True, True), lists)

    common = {"x_ptr": x, "probs_ptr": probs, "out_ptr": routed, "num_tokens": T, "num_routes": routed.shape[0]}
    common |= {"stride_xt": x.stride(0), "stride_xh": x.stride(1)}
    rows = {"sorted_ids_ptr": bufs.sorted_ids, "expert_ids_ptr": bufs.expert_ids, "num_padded_ptr": bufs.num_padded}
    descriptors = {"w13_desc": "w13 descriptor", "wd_desc": "down descriptor"}
    expected = {
        "gluon": common | rows | descriptors,
        "gluon_ws": common | rows | descriptors,
        "gluon_routed": common | descriptors | {"lists_ptr": lists.lists, "counts_ptr": lists.counts},
        "tma": common | rows | {"w13_desc": f"{[2 * TILE.block_i, D]}", "wd_desc": f"{[TILE.block_i, D]}"},
        "one_kernel": common | rows | {"wg_ptr": w13, "wu_ptr": ops.wu, "wd_ptr": wd},
    }
    expected["gluon_routed"]["list_stride"] = lists.stride
    strides = dict(zip(("stride_wf", "stride_wk", "stride_wn"), w_strides, strict=True))
    expected["one_kernel"] |= strides
    for variant, want in expected.items():
        got = _by_name(recorders[variant])
        for name, value in want.items():
            assert got[name] is value or (type(value) is not torch.Tensor and got[name] == value), (variant, name)
        positional = [n for n in got if n not in want]
        assert not positional, f"{variant}: positional arguments this test does not know: {positional}"
