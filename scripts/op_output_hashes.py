"""Hash every op's outputs through the public API on fixed random inputs, to show a change is bit-identical.

    python scripts/op_output_hashes.py --device cuda --out /tmp/hashes_after.json
    # on the other commit (this script uses only the public API, so it runs there as it is):
    python scripts/op_output_hashes.py --device cuda --out /tmp/hashes_before.json
    cmp /tmp/hashes_before.json /tmp/hashes_after.json

Each op runs through whatever provider resolution picks on the device (and the reference, forced), in
FP32 and BF16, with the options that change the path (sinks and softcap with both rescales, both score
functions with and without normalisation, deterministic and prepared expert weights, modality groups).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

import magi2_core as m2
from magi2_core.errors import ResolutionError


def _digest(t: Any) -> Any:
    if isinstance(t, (tuple, list)):
        return [_digest(x) for x in t]
    raw = t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return f"{hashlib.sha256(raw).hexdigest()[:16]} {tuple(t.shape)} {t.dtype}"


def hashes(device: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for provider in (None, "reference"):
        tag = provider or "resolved"
        for dt in (torch.float32, torch.bfloat16):
            g = torch.Generator().manual_seed(1)

            def rand(*shape: int, dtype: torch.dtype = dt, g: torch.Generator = g) -> torch.Tensor:
                return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

            q, k, v = rand(300, 4, 64), rand(410, 2, 64), rand(410, 2, 64)
            cq = torch.tensor([0, 70, 300], dtype=torch.int32, device=device)
            ck = torch.tensor([0, 200, 410], dtype=torch.int32, device=device)
            sinks = rand(1, 4, dtype=torch.float32)
            for rescale in ("fp32", "activation"):
                out[f"{tag}/attention/{dt}/{rescale}"] = _digest(m2.attention(
                    q, k, v, cq, ck, max_seqlen_q=230, max_seqlen_k=210, sinks=sinks, softcap=5.0, return_lse=True,
                    sink_rescale=rescale, provider=provider))  # type: ignore[call-overload]
            out[f"{tag}/attention/{dt}/plain"] = _digest(m2.attention(q, k, v, cq, ck, max_seqlen_q=230,
                                                                      max_seqlen_k=210, provider=provider))
            x, w, b = rand(170, 3, 64), rand(3 * 16, 64, dtype=torch.float32), rand(3 * 16, dtype=torch.float32)
            for score in ("sigmoid", "softmax"):
                for norm in (True, False):
                    try:
                        out[f"{tag}/moe_route/{dt}/{score}/{norm}"] = _digest(m2.moe_route(
                            x, w, b, top_k=4, score_func=score, route_norm=norm, provider=provider))  # type: ignore[arg-type]
                    except ResolutionError as exc:  # a forced provider without the option
                        out[f"{tag}/moe_route/{dt}/{score}/{norm}"] = type(exc).__name__
            probs, idx = m2.moe_route(x, w, b, top_k=4)
            wg, wu, wd = rand(3 * 16, 64, 128), rand(3 * 16, 64, 128), rand(3 * 16, 128, 64)
            out[f"{tag}/moe_experts/{dt}"] = _digest(m2.moe_experts(x, probs, idx, wg, wu, wd, provider=provider))
            out[f"{tag}/moe_experts/{dt}/prepared"] = _digest(m2.moe_experts(
                x, probs, idx, m2.prepare_moe_weights(wg, wu, wd, provider=provider), provider=provider))
            try:
                out[f"{tag}/moe_experts/{dt}/deterministic"] = _digest(m2.moe_experts(
                    x, probs, idx, wg, wu, wd, deterministic=True, provider=provider))
            except ResolutionError as exc:
                out[f"{tag}/moe_experts/{dt}/deterministic"] = type(exc).__name__
            xn, wn = rand(100, 3, 256), rand(2 * 3 * 256, dtype=torch.float32)
            out[f"{tag}/rmsnorm/{dt}"] = _digest(m2.rmsnorm(xn, wn, modality_sizes=[40, 60], provider=provider))
            out[f"{tag}/rmsnorm/{dt}/fp32-out"] = _digest(m2.rmsnorm(xn, wn, modality_sizes=[40, 60],
                                                                     out_dtype=torch.float32, provider=provider))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with torch.no_grad():
        result = hashes(args.device)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{len(result)} outputs hashed on {args.device} -> {args.out}")


if __name__ == "__main__":
    main()
