#!/usr/bin/env bash
# One device call on the lent H200 (image: python 3.12, torch 2.11+cu130, triton 3.6, no pydantic, no
# network): install the carried wheels (.whl: pydantic, fa3-fwd), install the local distributions
# editable, then run the whole GPU test suite (no -x; counts printed, log in $OUT/gpu_tests.log, JUnit
# in $OUT/gpu.xml), the conformance kit on CUDA, the demo and the quick benchmarks.
# Everything lands under $OUT. Usage there: MAGI2_GIT_COMMIT=$(git rev-parse --short HEAD) bash scripts/h200_session.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation -e backends/reference -e backends/triton \
  -e backends/cuda_fa3 -e backends/musa_mate -e tests/plugins/example -e . > "$OUT/install.log" 2>&1 \
  || { tail -20 "$OUT/install.log"; exit 1; }
export MAGI2_GIT_COMMIT=${MAGI2_GIT_COMMIT:-unknown}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -m magi2_core.cli backends > "$OUT/backends.txt" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
want() { [ -z "${MAGI2_STEPS:-}" ] || [[ ",$MAGI2_STEPS," == *",$1,"* ]]; }  # MAGI2_STEPS=a,b: only those
if want tests; then
step "gpu tests (the whole GPU suite: never stops at the first failure; skips listed with their reasons)"
python3 -m pytest -q -p no:cacheprovider -m gpu tests backends -rfEs --junitxml="$OUT/gpu.xml" > "$OUT/gpu_tests.log" 2>&1
echo "commit $MAGI2_GIT_COMMIT" >> "$OUT/gpu_tests.log"
grep -E "^(FAILED|ERROR) " "$OUT/gpu_tests.log" | head -40
python3 - "$OUT/gpu.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
print(f"gpu tests: {passed} passed, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped")
PY
tail -1 "$OUT/gpu_tests.log"
fi
if want conformance; then
step "conformance on cuda"
python3 -m pytest -q -p no:cacheprovider -p magi2_core.testing.plugin --magi2-conformance --magi2-only \
  --magi2-device cuda -rs > "$OUT/conformance_cuda.log" 2>&1
tail -3 "$OUT/conformance_cuda.log"
fi
if want demo; then
step "demo"
python3 -m magi2_core.cli demo --device cuda 2>&1 | tail -9
fi
if want norm; then
step "rmsnorm + sink benchmarks (final default tiles)"
python3 -m benchmarks.rmsnorm --json "$OUT/rmsnorm_h200.json" > "$OUT/rmsnorm.log" 2>&1; tail -8 "$OUT/rmsnorm.log"
python3 -m benchmarks.sink_correction --json "$OUT/sink_correction_h200.json" > "$OUT/sink.log" 2>&1; tail -6 "$OUT/sink.log"
fi
if want attention; then
step "attention benchmark (final rule)"
python3 -m benchmarks.attention --quick --out "$OUT/attention_h200.json" > "$OUT/attention.log" 2>&1; tail -22 "$OUT/attention.log"
fi
step "done"
