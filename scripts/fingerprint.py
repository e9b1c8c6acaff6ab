"""Bit-level fingerprints of every op on every provider that can run here, to show that a refactor
changed no result.

    python scripts/fingerprint.py --out before.json            # at the old commit
    python scripts/fingerprint.py --out after.json --compare before.json

Fixed seeds, fixed small shapes (the CPU runs Triton under TRITON_INTERPRET=1), one SHA-256 per
(device, op, provider, case) over the output tensors' raw bytes. ``--compare`` exits 1 when any entry
present in both files differs (a provider not eligible before and eligible now is listed, not a
difference), and lists entries present in only one of them.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

import magi2_core as m2
from magi2_core.testing.op_cases.mhc_pre import mhc_parameters, mhc_streams

Case = tuple[str, Callable[[str], Any]]


def _digest(out: Any) -> str:
    h = hashlib.sha256()
    for t in out if isinstance(out, tuple) else (out,):
        t = t.detach().contiguous().cpu()
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _gen(device: str, seed: int) -> torch.Generator:  # inputs drawn on the CPU: the same on every device
    return torch.Generator(device="cpu").manual_seed(seed)


def _rand(g: torch.Generator, *shape: int, dtype: torch.dtype, device: str, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)


def attention_cases(device: str) -> Iterator[tuple[str, dict[str, Any]]]:
    # (query heads, kv heads, head dim, sinks, softcap, segment bounds). The long cases (GPU only) are
    # outside the H200 profile's short-work and FA4-sink preferences, so that FA3 is also the resolved
    # provider there.
    shapes = {
        "mha_sink": (4, 4, 64, True, 0.0, (0, 37, 100)),
        "gqa_nosink": (4, 2, 64, False, 0.0, (0, 37, 100)),
        "softcap_sink": (2, 2, 128, True, 30.0, (0, 37, 100)),
    }
    if device != "cpu":
        shapes["long_sink"] = (8, 8, 128, True, 0.0, (0, 4000, 9000))
        shapes["long_gqa_softcap_sink"] = (8, 2, 128, True, 30.0, (0, 4000, 9000))
    for name, (hq, hkv, d, sinks, softcap, bounds) in shapes.items():
        g = _gen(device, zlib.crc32(name.encode()))
        t = bounds[-1]
        cu = torch.tensor(bounds, dtype=torch.int32, device=device)
        longest = max(b - a for a, b in itertools.pairwise(bounds))
        kw: dict[str, Any] = {
            "q": _rand(g, t, hq, d, dtype=torch.bfloat16, device=device),
            "k": _rand(g, t, hkv, d, dtype=torch.bfloat16, device=device),
            "v": _rand(g, t, hkv, d, dtype=torch.bfloat16, device=device),
            "cu_seqlens_q": cu,
            "cu_seqlens_k": cu,
            "max_seqlen_q": longest,
            "max_seqlen_k": longest,
            "softcap": softcap,
            "sinks": _rand(g, 1, hq, dtype=torch.float32, device=device) if sinks else None,
            "return_lse": True,
        }
        yield name, kw


def route_inputs(device: str, t: int = 40, hl: int = 2, e: int = 16, d: int = 32) -> dict[str, Any]:
    g = _gen(device, 7)
    return {
        "x": _rand(g, t, hl, d, dtype=torch.bfloat16, device=device),
        "router_weight": _rand(g, hl * e, d, dtype=torch.float32, device=device, scale=d**-0.5),
        "bias": _rand(g, hl * e, dtype=torch.float32, device=device, scale=0.01),
    }


def expert_inputs(device: str, dtype: torch.dtype) -> dict[str, Any]:
    r = route_inputs(device)
    probs, idx = m2.moe_route(r["x"], r["router_weight"], r["bias"], top_k=4, provider="reference")
    g = _gen(device, 11)
    f, d, i = r["router_weight"].shape[0], 32, 64
    return {
        "x": r["x"].to(dtype),
        "probs": probs,
        "idx": idx,
        "w_gate": _rand(g, f, d, i, dtype=dtype, device=device, scale=0.2),
        "w_up": _rand(g, f, d, i, dtype=dtype, device=device, scale=0.2),
        "w_down": _rand(g, f, i, d, dtype=dtype, device=device, scale=0.2),
    }


def rmsnorm_inputs(device: str, dtype: torch.dtype) -> dict[str, Any]:
    g = _gen(device, 13)
    return {
        "x": _rand(g, 30, 3, 64, dtype=dtype, device=device, scale=3.0),
        "weight": _rand(g, 2, 3, 64, dtype=torch.float32, device=device, scale=0.1),
        "modality_sizes": [12, 18],
    }


_MHC_PRE_ARGS = (
    "streams",
    "norm_weight",
    "phi",
    "alpha_pre",
    "alpha_post",
    "alpha_res",
    "bias_pre",
    "bias_post",
    "bias_res",
)


def mhc_pre_inputs(device: str, dtype: torch.dtype) -> dict[str, Any]:
    g = _gen(device, 17)
    x = mhc_streams(g, 20, 4, 32, dtype)
    values = (x, *mhc_parameters(g, 2, 4, 32))
    return {k: v.to(device) for k, v in zip(_MHC_PRE_ARGS, values, strict=True)} | {"modality_sizes": [13, 7]}


def mhc_mix_inputs(device: str, dtype: torch.dtype) -> dict[str, Any]:
    g = _gen(device, 19)
    return {
        "streams": mhc_streams(g, 20, 4, 32, dtype).to(device),
        "branch_output": mhc_streams(g, 20, 1, 32, dtype)[:, 0].to(device),
        "post": (torch.rand(20, 4, generator=g) * 2).to(device),
        "residual": torch.rand(20, 4, 4, generator=g).to(device),
    }


def qk_norm_rope_inputs(device: str, dtype: torch.dtype) -> dict[str, Any]:
    g = _gen(device, 23)
    angles = _rand(g, 20, 12, dtype=torch.float32, device=device, scale=3.0)
    return {
        "x": _rand(g, 20, 3, 32, dtype=dtype, device=device, scale=2.0),
        "weight": _rand(g, 2, 32, dtype=torch.float32, device=device, scale=0.1),
        "rope": torch.cat((angles.sin(), angles.cos()), dim=-1),
        "modality_sizes": [13, 7],
        "index": torch.randperm(20, generator=torch.Generator().manual_seed(23)).to(device),
    }


def output_gate_inputs(device: str, dtype: torch.dtype) -> dict[str, Any]:
    g = _gen(device, 29)
    return {
        "x": _rand(g, 20, 3, 32, dtype=dtype, device=device, scale=2.0),
        "gate": _rand(g, 20, 3, 1, dtype=dtype, device=device, scale=3.0),
        "index": torch.randperm(20, generator=torch.Generator().manual_seed(29)).to(device),
    }


def cases(device: str) -> Iterator[tuple[str, str, Callable[..., Any], dict[str, Any]]]:
    for name, kw in attention_cases(device):
        yield "attention", name, m2.attention, kw
    r = route_inputs(device)
    yield "moe_route", "sigmoid_norm", m2.moe_route, {**r, "top_k": 4}
    yield "moe_route", "softmax_nonorm", m2.moe_route, {**r, "top_k": 4, "score_func": "softmax", "route_norm": False}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        tag = str(dtype).removeprefix("torch.")
        yield "moe_experts", tag, m2.moe_experts, expert_inputs(device, dtype)
        yield (
            "moe_experts",
            f"{tag}_deterministic",
            m2.moe_experts,
            {**expert_inputs(device, dtype), "deterministic": True},
        )
        yield "rmsnorm", tag, m2.rmsnorm, rmsnorm_inputs(device, dtype)
        yield "mhc_pre", tag, m2.mhc_pre, mhc_pre_inputs(device, dtype)
        yield "mhc_mix", tag, m2.mhc_mix, mhc_mix_inputs(device, dtype)
        yield "qk_norm_rope", tag, m2.qk_norm_rope, qk_norm_rope_inputs(device, dtype)
        yield "output_gate", tag, m2.output_gate, output_gate_inputs(device, dtype)


def fingerprints(devices: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    reg = m2.get_registry()
    for device in devices:
        for op, case, fn, kw in cases(device):
            for prov in reg.providers(op):
                key = f"{device}/{op}/{prov.name}/{case}"
                try:
                    with torch.no_grad():
                        out[key] = _digest(fn(**kw, provider=prov.name))
                except m2.ResolutionError as exc:  # not eligible here: recorded, not compared
                    out[key] = f"not eligible: {type(exc).__name__}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--compare", help="an earlier fingerprint file; exit 1 on any difference")
    args = ap.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    fp = fingerprints(devices)
    with open(args.out, "w") as f:
        json.dump(fp, f, indent=1, sort_keys=True)
    ran = sum(not v.startswith("not eligible") for v in fp.values())
    print(f"{ran} fingerprints ({len(fp) - ran} not eligible) -> {args.out}")
    if not args.compare:
        return 0
    with open(args.compare) as f:
        old = json.load(f)
    both = fp.keys() & old.keys()
    # A provider that could not serve a case before and can now (a speed rule that turned it away became
    # a profile preference) has no earlier result to compare: listed, not a difference.
    now = sorted(k for k in both if old[k].startswith("not eligible") and not fp[k].startswith("not eligible"))
    differ = sorted(k for k in both if fp[k] != old[k] and k not in now)
    only = sorted(fp.keys() ^ old.keys())
    compared = sum(1 for k in fp.keys() & old.keys() if not fp[k].startswith("not eligible"))
    for k in differ:
        print(f"DIFFERS: {k}: {old[k][:16]} -> {fp[k][:16]}")
    for k in now:
        print(f"now eligible: {k}")
    for k in only:
        print(f"only in {'new' if k in fp else 'old'}: {k}")
    print(f"{compared} compared, {len(differ)} differ, {len(now)} now eligible, {len(only)} in one file only")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
