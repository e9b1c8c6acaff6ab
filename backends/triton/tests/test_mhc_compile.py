"""The mHC logits kernels compile for sm_90 (Hopper) with the installed Triton, on a machine without a GPU:
Triton's ahead-of-time path lowers them to PTX and assembles them with the ``ptxas`` its wheel ships. The
interpreter runs a kernel's arithmetic but not its lowering; this catches what only a compiler refuses
(a dot's operand layouts, shared memory beyond the device's), and checks that the split-BF16 launch
reaches the tensor cores (``wgmma``) while the IEEE FP32 dot stays on the FMA units."""

from __future__ import annotations

import os

import pytest
import triton
from magi2_backend_triton import mhc_pre as kernel

try:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction
except ImportError:  # pragma: no cover - an older Triton's layout
    pytest.skip("this Triton has no ahead-of-time ASTSource/GPUTarget API", allow_module_level=True)

if os.environ.get("TRITON_INTERPRET") == "1" and tuple(int(v) for v in triton.__version__.split(".")[:2]) < (3, 6):
    # before 3.6 the interpreter replaces triton.language's builder for the whole process
    pytest.skip("Triton < 3.6 cannot compile ahead of time under TRITON_INTERPRET=1", allow_module_level=True)

HOPPER = GPUTarget("cuda", 90, 32)
SMEM_LIMIT = 227 * 1024  # an sm_90 block's shared memory
_SPLIT = {"x_ptr": "*bf16", "p_ptr": "*bf16", "out_ptr": "*fp32", "T": "i32", "NL": "i32", "stride_xt": "i64",
          "eps": "fp32", "K": "constexpr", "BLOCK_T": "constexpr", "BLOCK_K": "constexpr", "BLOCK_N": "constexpr",
          "UPCAST": "constexpr"}  # fmt: skip
_FP32 = {"x_ptr": "*bf16", "w_ptr": "*fp32", "phi_ptr": "*fp32", "out_ptr": "*fp32", "T": "i32", "NL": "i32",
         "stride_xt": "i64", "stride_wm": "i64", "b1": "i32", "b2": "i32", "b3": "i32", "eps": "fp32",
         "K": "constexpr", "NUM_MOD": "constexpr", "BLOCK_T": "constexpr", "BLOCK_K": "constexpr",
         "BLOCK_N": "constexpr", "PRECISION": "constexpr"}  # fmt: skip


def _compile(fn: object, signature: dict[str, str], constexprs: dict[str, object], cfg: kernel.LogitsConfig) -> object:
    if not isinstance(fn, JITFunction):  # under TRITON_INTERPRET=1 the decorator gave an interpreted function
        fn = JITFunction(fn.fn)  # type: ignore[attr-defined]
    try:
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        return triton.compile(src, target=HOPPER, options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    except (FileNotFoundError, RuntimeError) as exc:
        if "ptxas" in str(exc):
            pytest.skip(f"no ptxas with this Triton: {exc}")
        raise


@pytest.mark.parametrize(
    "cfg",
    [
        kernel.LogitsConfig(block_t=64, block_k=64, precision="bf16x3"),
        kernel.LogitsConfig(block_t=128, block_k=128, precision="bf16x3", num_warps=8),
    ],
    ids=str,
)
def test_the_split_bf16_logits_kernel_compiles_to_tensor_core_code(cfg: kernel.LogitsConfig) -> None:
    constexprs = {"K": 12288, "BLOCK_T": cfg.block_t, "BLOCK_K": cfg.block_k, "BLOCK_N": 32, "UPCAST": False}
    compiled = _compile(kernel._mhc_logits_split_kernel, _SPLIT, constexprs, cfg)
    assert "wgmma.mma_async" in compiled.asm["ptx"]  # type: ignore[attr-defined]
    assert compiled.metadata.shared <= SMEM_LIMIT  # type: ignore[attr-defined]


def test_the_shipped_fp32_logits_launch_compiles() -> None:
    cfg = kernel.LOGITS
    constexprs = {"K": 12288, "NUM_MOD": 3, "BLOCK_T": cfg.block_t, "BLOCK_K": cfg.block_k, "BLOCK_N": 32,
                  "PRECISION": cfg.precision}  # fmt: skip
    compiled = _compile(kernel._mhc_logits_kernel, _FP32, constexprs, cfg)
    assert compiled.metadata.shared <= SMEM_LIMIT  # type: ignore[attr-defined]
    if cfg.precision == "ieee":
        assert "fma.rn.f32" in compiled.asm["ptx"]  # type: ignore[attr-defined]
