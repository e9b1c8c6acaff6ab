#!/usr/bin/env bash
# On a machine with PyPI access: download what an offline NVIDIA GPU machine needs on top of the
# CUDA torch and Triton it already has (CPython 3.12, x86-64 Linux), into a wheelhouse directory
# that you then copy to it. scripts/gpu_session.sh installs from that wheelhouse with --no-index.
#
#   scripts/gpu_wheelhouse.sh WHEELHOUSE [--fa4]
#
# Always: pydantic (and its needs), fa3-fwd (FlashAttention-3 forward for Hopper) and vllm-omni
# 0.30.0 (only its wheel, --no-deps: the integration tests and benchmarks import its MAGI-2 modules
# with vLLM stubbed). --fa4 adds flash-attn-4 and the CuTe DSL (about 230 MB).
set -euo pipefail
dest=${1:?usage: scripts/gpu_wheelhouse.sh WHEELHOUSE [--fa4]}
fa4=${2:-}
plat=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)
mkdir -p "$dest"
python3 -m pip download -q "${plat[@]}" -d "$dest" pydantic pydantic-core typing-inspection annotated-types \
  fa3-fwd==0.0.3
python3 -m pip download -q --no-deps -d "$dest" vllm-omni==0.30.0
if [ "$fa4" = "--fa4" ]; then
  python3 -m pip download -q "${plat[@]}" -d "$dest" flash-attn-4==4.0.0b36 quack-kernels apache-tvm-ffi \
    torch-c-dlpack-ext nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 \
    nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1
fi
du -sh "$dest"
