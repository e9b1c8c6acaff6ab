#!/usr/bin/env bash
# The device calls on the lent H200 (image: python 3.12, torch 2.11+cu130, triton 3.6, no pydantic, no
# network). Installs the carried payload (scripts/h200_env.sh: carry .whl/p1, and .whl/p2 in a call that
# follows for FlashAttention-4), installs the local distributions editable, then runs the steps named in
# MAGI2_SWEEP_ARGS: extra arguments of benchmarks.moe_sweep (e.g. --variants gluon). MAGI2_STEPS (all when unset): the whole GPU test suite (no -x; counts printed, log in $OUT/gpu_tests.log,
# JUnit in $OUT/gpu.xml), the conformance kit on CUDA, the demo and the benchmarks.
# Everything lands under $OUT. Usage there: MAGI2_GIT_COMMIT=<sha> MAGI2_STEPS=tests,block bash scripts/h200_session.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
source scripts/h200_env.sh
python3 -m pip install -q --no-deps --no-build-isolation -e backends/reference -e backends/triton \
  -e backends/cuda_fa3 -e backends/cuda_fa4 -e backends/musa_mate -e tests/plugins/example -e . > "$OUT/install.log" 2>&1 \
  || { tail -20 "$OUT/install.log"; exit 1; }
export MAGI2_GIT_COMMIT=${MAGI2_GIT_COMMIT:-unknown}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -m magi2_core.cli backends > "$OUT/backends.txt" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
want() { [ -z "${MAGI2_STEPS:-}" ] || [[ ",$MAGI2_STEPS," == *",$1,"* ]]; }  # MAGI2_STEPS=a,b: only those
counts() {  # $1: JUnit XML -> "N passed, N failed, N errors, N skipped"
python3 - "$1" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
print(f"{passed} passed, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped")
PY
}
gpu_tests() {  # $1: name; rest: pytest paths. Never stops at the first failure.
  local name=$1; shift
  python3 -m pytest -q -p no:cacheprovider -m gpu "$@" -rfEs --junitxml="$OUT/$name.xml" > "$OUT/$name.log" 2>&1
  echo "commit $MAGI2_GIT_COMMIT; fa4 payload: $([ -f /tmp/site/.p2 ] && echo installed || echo absent)" >> "$OUT/$name.log"
  grep -E "^(FAILED|ERROR) " "$OUT/$name.log" | head -40
  echo "$name: $(counts "$OUT/$name.xml")"
}
if want tests; then
step "gpu tests (the whole GPU suite; skips listed with their reasons)"
gpu_tests gpu_tests tests backends
fi
if want fa_tests; then
step "gpu tests of the attention backends (after the FA4 payload)"
gpu_tests gpu_tests_attention backends/cuda_fa4/tests backends/cuda_fa3/tests tests/test_torch_native_gpu.py
fi
if want conformance; then
step "conformance on cuda"
python3 -m pytest -q -p no:cacheprovider -p magi2_core.testing.plugin --magi2-conformance --magi2-only \
  --magi2-device cuda -rs > "$OUT/conformance_cuda.log" 2>&1
tail -3 "$OUT/conformance_cuda.log"
fi
if want fingerprint; then
step "fingerprints of every op x provider (MAGI2_FP_COMPARE=<earlier file>: compare, exit status in the log)"
python3 scripts/fingerprint.py --out "$OUT/fingerprint_$MAGI2_GIT_COMMIT.json" ${MAGI2_FP_COMPARE:+--compare "$MAGI2_FP_COMPARE"} \
  > "$OUT/fingerprint.log" 2>&1; echo "fingerprint exit $?" >> "$OUT/fingerprint.log"
grep -vE "quarantined|took [0-9.]+ s|^  |^provid|For further" "$OUT/fingerprint.log" | tail -12
fi
if want route; then
step "routing pieces"
python3 -m benchmarks.route_profile --out "$OUT/route_profile_h200.json" > "$OUT/route.log" 2>&1; tail -3 "$OUT/route.log"
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
if want block; then
step "block benchmark (4-layer MAGI-2 stack, strict)"
python3 -m benchmarks.block --out "$OUT/block_h200.json" > "$OUT/block.log" 2>&1; tail -70 "$OUT/block.log"
fi
if want fa4; then
step "FA4 benchmark (resolved vs raw FA3, FA3 + correction, FA4 native sink; JIT latency)"
python3 -m benchmarks.attention_fa4 --quick --out "$OUT/attention_fa4_h200.json" > "$OUT/attention_fa4.log" 2>&1; tail -40 "$OUT/attention_fa4.log"
fi
if want vllm_omni; then
step "vllm-omni integration MoE stack"
python3 -m benchmarks.vllm_omni_moe --out "$OUT/vllm_omni_moe_h200.json" > "$OUT/vllm_omni_moe.log" 2>&1; tail -30 "$OUT/vllm_omni_moe.log"
fi
if want sweep; then
step "MoE kernel variants sweep"
python3 -m benchmarks.moe_sweep --out "$OUT/moe_sweep_h200.json" ${MAGI2_SWEEP_ARGS:-} > "$OUT/moe_sweep.log" 2>&1; tail -40 "$OUT/moe_sweep.log"
fi
if want cli; then
step "CLI on the GPU machine"
( time python3 -m magi2_core.cli --help > /dev/null ) 2>&1 | grep real
python3 -m magi2_core.cli env > "$OUT/env.txt" 2>&1; head -40 "$OUT/env.txt"
python3 -m magi2_core.cli demo --device cuda 2>&1 | tail -12
fi
if want dispatch; then
step "dispatch overhead against a no-op provider, on this host's CPU (quiet, unlike the CI/dev machine)"
python3 -m benchmarks.dispatch --out "$OUT/dispatch_cpu_h200host.json" 2>&1 | tail -6
python3 -m benchmarks.dispatch --device cuda --out "$OUT/dispatch_cuda.json" 2>&1 | tail -6
fi
if want moe; then
step "MoE: the table's kernel vs the previous (pointer) kernel and torch _grouped_mm, eager and graph"
python3 -m benchmarks.moe --out "$OUT/moe_h200.json" --tokens 512 4096 14601 --iters 20 > "$OUT/moe.log" 2>&1; tail -14 "$OUT/moe.log"
fi
if want moe_align; then
step "MoE route alignment: atomic vs stable kernels vs torch; the call in default and deterministic mode"
python3 -m benchmarks.moe_align --out "$OUT/moe_align_h200.json" > "$OUT/moe_align.log" 2>&1; tail -6 "$OUT/moe_align.log"
fi
if want moe_tests; then
step "MoE GPU tests only"
gpu_tests gpu_tests_moe backends/triton/tests/test_moe_fused.py backends/triton/tests/test_moe_gluon.py backends/triton/tests/test_moe_prepared.py
fi
if want moe_layers; then
step "MoE: N distinct layers in turn through the public op"
python3 -m benchmarks.moe --out "$OUT/moe_layers_h200.json" --tokens 512 4096 14601 --layers 4 --skip-12 --iters 20 > "$OUT/moe_layers.log" 2>&1; tail -30 "$OUT/moe_layers.log"
fi
step "done"
# At most 8 files come back from a device call: the logs travel as one archive beside the JSON results.
( cd "$OUT" && tar czf logs.tar.gz ./*.log ./*.xml ./*.txt 2>/dev/null && rm -f ./*.log ./*.xml ./*.txt )
