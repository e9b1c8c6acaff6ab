#!/usr/bin/env bash
# Here (a machine with PyPI): download what the lent H200 lacks and pack it into two halves of under
# 64 MiB each, because one device call carries at most 64 MiB. Output: .whl/p1 and .whl/p2 (ignored by
# git). p1/base: pydantic; p1/fa3.tar.xz: fa3-fwd re-packed with xz (27.6 MB -> 10 MB); p1/fa4: flash-attn-4,
# the small CuTe DSL wheels and the first part of the cu13 DSL libs; p2: the rest. See scripts/h200_env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
plat=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64)
dl=.whl/download; rm -rf "$dl" .whl/p1 .whl/p2; mkdir -p "$dl" .whl/p1/base .whl/p1/fa4 .whl/p2
python3 -m pip download -q "${plat[@]}" -d "$dl" pydantic pydantic-core typing-inspection annotated-types \
  fa3-fwd==0.0.3 flash-attn-4==4.0.0b36 quack-kernels apache-tvm-ffi torch-c-dlpack-ext \
  nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
  nvidia-cutlass-dsl-libs-cu13==4.8.1
xzpack() {  # wheel -> tar.xz of its unpacked tree (installed on the device by extracting into the site dir)
  local tmp; tmp=$(mktemp -d); python3 -m zipfile -e "$1" "$tmp"; tar -C "$tmp" -cf - . | xz -6 -T2 > "$2"; rm -rf "$tmp"
}
xzpack "$dl"/fa3_fwd-*.whl .whl/p1/fa3.tar.xz
xzpack "$dl"/nvidia_cutlass_dsl_libs_cu13-*.whl "$dl/cu13.tar.xz"
split -b 36000000 "$dl/cu13.tar.xz" "$dl/cu13.part."
mv "$dl/cu13.part.aa" .whl/p1/fa4/; mv "$dl/cu13.part.ab" .whl/p2/
for w in "$dl"/*.whl; do
  case "$w" in
    *fa3_fwd*|*libs_cu13*) ;;
    *pydantic*|*annotated_types*|*typing_inspection*) cp "$w" .whl/p1/base/ ;;
    *) cp "$w" .whl/p1/fa4/ ;;
  esac
done
du -sh .whl/p1 .whl/p2
