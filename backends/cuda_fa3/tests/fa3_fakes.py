"""Fake FA3 interface modules for CPU tests: each ABI variant, recording exactly what it was passed.

A fake computes the sink-free attention with the reference provider (FP32, rounded once) and
returns what the real build returns: ``out``, or ``(out, lse[Hq, Tq])`` when asked through its LSE
keyword. ``lse_layout="th"`` returns the wrong ``[Tq, Hq]`` layout, as some MATE builds do.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from magi2_backend_reference.attention import exact_attention


class FakeVarlen:
    """Records each call's keyword arguments; positional arguments are refused (keywords only)."""

    def __init__(
        self,
        *,
        lse_flag: str = "return_attn_probs",
        softcap: bool = True,
        sinks: bool = False,
        num_splits: bool = True,
        lse_layout: str = "ht",
        extra_outputs: int = 0,
    ) -> None:
        self.calls: list[dict[str, Any]] = []
        self.lse_layout = lse_layout
        self.extra_outputs = extra_outputs
        self.lse_flag = lse_flag
        self.error: Exception | None = None  # raised by the next call (a kernel failure)
        names = [
            "q",
            "k",
            "v",
            "cu_seqlens_q",
            "cu_seqlens_k",
            "max_seqlen_q",
            "max_seqlen_k",
            "seqused_q",
            "seqused_k",
            "softmax_scale",
            "causal",
            "window_size",
        ]
        names += ["softcap"] * softcap + ["num_splits"] * num_splits + ["sinks"] * sinks + [lse_flag]
        self.param_names = names
        # A real function with exactly these keywords, so inspect.signature reads them.
        src = "def flash_attn_varlen_func(" + ", ".join(f"{n}=None" for n in names) + "):\n    return impl(locals())\n"
        scope: dict[str, Any] = {"impl": self._impl}
        exec(src, scope)
        self.func = scope["flash_attn_varlen_func"]

    def _impl(self, given: dict[str, Any]) -> Any:
        passed = {k: v for k, v in given.items() if v is not None}
        self.calls.append(passed)
        if self.error is not None:
            raise self.error
        sinks = passed.get("sinks")
        o, lse = exact_attention(
            passed["q"],
            passed["k"],
            passed["v"],
            passed["cu_seqlens_q"],
            passed["cu_seqlens_k"],
            softmax_scale=passed["softmax_scale"],
            softcap=passed.get("softcap", 0.0),
            sinks=None if sinks is None else sinks[None, :],
            sink_rescale="fp32",
            return_lse=True,
        )
        if not passed.get(self.lse_flag):
            return o
        if self.lse_layout == "th":
            lse = lse.t().contiguous()
        return (o, lse, *([torch.empty(0)] * self.extra_outputs))


def install(monkeypatch: pytest.MonkeyPatch, module: str, varlen: FakeVarlen | None, **attrs: Any) -> types.ModuleType:
    """Put a fake module into ``sys.modules`` for this test only."""
    mod = types.ModuleType(module)
    if varlen is not None:
        mod.flash_attn_varlen_func = varlen.func  # type: ignore[attr-defined]
    for name, value in attrs.items():
        setattr(mod, name, value)
    monkeypatch.setitem(sys.modules, module, mod)
    return mod
