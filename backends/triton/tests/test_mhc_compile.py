"""The mHC logits kernels compile for sm_90 (Hopper) with the installed Triton, on a machine without a GPU:
Triton's ahead-of-time path lowers them to PTX and assembles them with the ``ptxas`` its wheel ships. The
interpreter runs a kernel's arithmetic but not its lowering; this catches what only a compiler refuses
(a dot's operand layouts, shared memory beyond the device's), and checks that the split-BF16 launch
reaches the tensor cores (``wgmma``) while the IEEE FP32 dot stays on the FMA units.

Each compilation runs in a fresh process without ``TRITON_INTERPRET``: once a process has run kernels
through the interpreter, Triton's language is patched for it and ahead-of-time compilation fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from magi2_backend_triton import mhc_pre as kernel

SMEM_LIMIT = 227 * 1024  # an sm_90 block's shared memory
_SPLIT = {
    "x_ptr": "*bf16",
    "p_ptr": "*bf16",
    "part_ptr": "*fp32",
    "sq_ptr": "*fp32",
    "T": "i32",
    "NL": "i32",
    "stride_xt": "i64",
    "stride_part": "i64",
    "stride_sq": "i64",
    **{f"{b}{i}": "i32" for b in "oc" for i in (1, 2, 3)},
    "K": "constexpr",
    "K_CHUNK": "constexpr",
    "BLOCK_T": "constexpr",
    "BLOCK_K": "constexpr",
    "BLOCK_N": "constexpr",
    "UPCAST": "constexpr",
}
_FP32 = {
    "x_ptr": "*bf16",
    "w_ptr": "*fp32",
    "phi_ptr": "*fp32",
    "out_ptr": "*fp32",
    "T": "i32",
    "NL": "i32",
    "stride_xt": "i64",
    "stride_wm": "i64",
    "b1": "i32",
    "b2": "i32",
    "b3": "i32",
    "eps": "fp32",
    "K": "constexpr",
    "NUM_MOD": "constexpr",
    "BLOCK_T": "constexpr",
    "BLOCK_K": "constexpr",
    "BLOCK_N": "constexpr",
    "PRECISION": "constexpr",
}


def _compile_here(
    name: str, signature: dict[str, str], constexprs: dict[str, Any], warps: int, stages: int
) -> dict[str, Any]:
    """Compile ``kernel.<name>`` for sm_90 in this process; what the tests look at, or why it could not."""
    import triton

    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
    except ImportError:  # an older Triton's layout
        return {"skip": "this Triton has no ahead-of-time ASTSource/GPUTarget API"}
    src = ASTSource(fn=getattr(kernel, name), signature=signature, constexprs=constexprs)
    try:
        compiled = triton.compile(
            src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages}
        )
    except (FileNotFoundError, RuntimeError) as exc:
        if "ptxas" in str(exc):
            return {"skip": f"no ptxas with this Triton: {exc}"}
        raise
    ptx = compiled.asm["ptx"]
    return {"wgmma": "wgmma.mma_async" in ptx, "fma": "fma.rn.f32" in ptx, "shared": compiled.metadata.shared}


def _compile(
    name: str, signature: dict[str, str], constexprs: dict[str, Any], cfg: kernel.LogitsConfig
) -> dict[str, Any]:
    job = json.dumps([name, signature, constexprs, cfg.num_warps, cfg.num_stages])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, __file__, job], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    facts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in facts:
        pytest.skip(facts["skip"])
    return facts


def _split_constexprs(cfg: kernel.LogitsConfig) -> dict[str, Any]:
    chunk = -(-12288 // cfg.split_k // cfg.block_k) * cfg.block_k
    return {
        "K": 12288,
        "K_CHUNK": chunk,
        "BLOCK_T": cfg.block_t,
        "BLOCK_K": cfg.block_k,
        "BLOCK_N": 32,
        "UPCAST": False,
    }


@pytest.mark.parametrize(
    "cfg",
    [
        kernel.LogitsConfig(block_t=64, block_k=64, precision="bf16x3"),
        kernel.LogitsConfig(block_t=128, block_k=128, precision="bf16x3", num_warps=8),
        kernel.LogitsConfig(block_t=64, block_k=64, precision="bf16x3", num_warps=4, num_stages=4, split_k=4),
    ],
    ids=str,
)
def test_the_split_bf16_logits_kernel_compiles_to_tensor_core_code(cfg: kernel.LogitsConfig) -> None:
    facts = _compile("_mhc_logits_split_kernel", _SPLIT, _split_constexprs(cfg), cfg)
    assert facts["wgmma"] and facts["shared"] <= SMEM_LIMIT


def test_the_shipped_split_logits_launch_compiles_to_tensor_core_code() -> None:
    cfg = kernel.LOGITS
    assert cfg.precision == "bf16x3"
    facts = _compile("_mhc_logits_split_kernel", _SPLIT, _split_constexprs(cfg), cfg)
    assert facts["wgmma"] and facts["shared"] <= SMEM_LIMIT


def test_the_shipped_fp32_logits_launch_compiles() -> None:
    cfg = kernel.LOGITS_FP32
    constexprs = {
        "K": 12288,
        "NUM_MOD": 3,
        "BLOCK_T": cfg.block_t,
        "BLOCK_K": cfg.block_k,
        "BLOCK_N": 32,
        "PRECISION": cfg.precision,
    }
    facts = _compile("_mhc_logits_kernel", _FP32, constexprs, cfg)
    assert facts["shared"] <= SMEM_LIMIT
    if cfg.precision == "ieee":
        assert facts["fma"]


if __name__ == "__main__":  # one compilation, for _compile's fresh process
    print(json.dumps(_compile_here(*json.loads(sys.argv[1]))))
