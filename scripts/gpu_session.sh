#!/usr/bin/env bash
# Runs the GPU test suite, the conformance kit and the benchmarks on an NVIDIA machine that has a
# CUDA torch and Triton but may have no network. Everything it needs beyond those comes from a
# wheelhouse made elsewhere by scripts/gpu_wheelhouse.sh; it is installed into a private prefix, and
# the checkout's distributions are installed editable on top.
#
#   MAGI2_OUT=DIR [MAGI2_WHEELHOUSE=DIR] [MAGI2_PREFIX=DIR] [MAGI2_STEPS=tests,block,...] \
#     [MAGI2_GIT_COMMIT=<sha>] bash scripts/gpu_session.sh
#
# MAGI2_OUT: where logs, JUnit XML and benchmark JSON go. MAGI2_WHEELHOUSE: the wheelhouse (default:
# none, for a machine that already has pydantic and the kernel libraries). MAGI2_PREFIX: the install
# prefix for the wheelhouse (default: ${TMPDIR:-/tmp}/magi2-prefix, kept for later runs). MAGI2_STEPS: the steps below to run (all
# when unset). MAGI2_GIT_COMMIT: recorded in every result (default: git rev-parse, when .git exists).
# A vllm-omni wheel found in the wheelhouse is handed to the integration tests and benchmarks through
# MAGI2_VLLM_OMNI_WHEEL.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${MAGI2_OUT:?set MAGI2_OUT to the output directory}
mkdir -p "$OUT"
prefix=${MAGI2_PREFIX:-${TMPDIR:-/tmp}/magi2-prefix}
if [ -n "${MAGI2_WHEELHOUSE:-}" ]; then
  mkdir -p "$prefix"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$prefix" \
    "$MAGI2_WHEELHOUSE"/*.whl --find-links "$MAGI2_WHEELHOUSE" > "$OUT/wheelhouse.log" 2>&1 \
    || { tail -20 "$OUT/wheelhouse.log"; exit 1; }
  # PYTHONPATH entries do not process .pth files (the CuTe DSL adds its packages through one).
  extra=$(cat "$prefix"/*.pth 2>/dev/null | grep -v '^import' | sed "s|^\([^/]\)|$prefix/\1|" | paste -sd: -)
  export PYTHONPATH="$prefix${extra:+:$extra}${PYTHONPATH:+:$PYTHONPATH}"
  wheel=$(ls "$MAGI2_WHEELHOUSE"/vllm_omni-*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] && export MAGI2_VLLM_OMNI_WHEEL=$wheel
fi
# magi2-core needs pydantic, which a bare CUDA image may lack: say so before anything imports it.
python3 -c "import pydantic" 2>/dev/null || {
  echo "gpu_session.sh: pydantic is not importable here: set MAGI2_WHEELHOUSE to a wheelhouse made by" \
    "scripts/gpu_wheelhouse.sh, or install pydantic" >&2
  exit 1
}
python3 -m pip install -q --no-deps --no-build-isolation -e backends/reference -e backends/triton \
  -e backends/cuda_fa3 -e backends/cuda_fa4 -e backends/musa_mate -e tests/plugins/example -e . > "$OUT/install.log" 2>&1 \
  || { tail -20 "$OUT/install.log"; exit 1; }
export MAGI2_GIT_COMMIT=${MAGI2_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# Result files are named after the GPU (NVIDIA H200 -> *_h200.json); MAGI2_DEVICE_TAG overrides.
# (NVIDIA H100 80GB HBM3 -> h100: the first word that is letters then digits)
tag=${MAGI2_DEVICE_TAG:-$(python3 -c "import re, torch; n = torch.cuda.get_device_name(); m = re.search(r'\b[A-Z]+[0-9]+[A-Za-z]*\b', n); print((m.group(0) if m else n.split()[-1]).lower())")}
python3 -m magi2_core.cli backends > "$OUT/backends.txt" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
# MAGI2_STEPS=a,b: only those; "final" stands for the checks of a final commit (tests,conformance,fingerprint)
steps=${MAGI2_STEPS:-}
[[ ",$steps," == *",final,"* ]] && steps="$steps,tests,conformance,fingerprint"
want() { [ -z "$steps" ] || [[ ",$steps," == *",$1,"* ]]; }
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
  echo "commit $MAGI2_GIT_COMMIT; flash-attn-4: $(python3 -c 'import flash_attn.cute' 2>/dev/null && echo installed || echo absent)" >> "$OUT/$name.log"
  grep -E "^(FAILED|ERROR) " "$OUT/$name.log" | head -40
  echo "$name: $(counts "$OUT/$name.xml")"
}
# The kit and the fingerprints first: a minute or two that cover every op, before the suite's longer run.
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
if want tests; then
step "gpu tests (the whole GPU suite; skips listed with their reasons)"
gpu_tests gpu_tests tests backends
fi
if want fa_tests; then
step "gpu tests of the attention backends"
gpu_tests gpu_tests_attention backends/cuda_fa4/tests backends/cuda_fa3/tests tests/test_torch_native_gpu.py
fi
if want route_tests; then
step "routing GPU tests (fused router, Triton selection provider)"
gpu_tests gpu_tests_route backends/triton/tests/test_moe_route_fused.py backends/triton/tests/test_moe_route.py
fi
if want route; then
step "routing: fused router configs, the selection provider, vllm-omni's route rebuilt, torch; the contract check"
python3 -m benchmarks.route_profile --out "$OUT/route_fused_${tag}.json" > "$OUT/route.log" 2>&1; tail -40 "$OUT/route.log"
fi
if want integration_tests; then
step "vllm-omni integration GPU tests (real vllm-omni modules from the wheel)"
gpu_tests gpu_tests_integration tests/integrations
fi
if want vllm_stack; then
step "vllm-omni MAGI-2 layer stack, plugin off vs on (MAGI2_STACK_ARGS: extra arguments; MAGI2_STACK_SUFFIX: file names)"
python3 -m benchmarks.vllm_omni_stack --wheel "${MAGI2_VLLM_OMNI_WHEEL:?no vllm-omni wheel in the wheelhouse}" \
  --out "$OUT/vllm_omni_stack_${tag}${MAGI2_STACK_SUFFIX:-}.json" ${MAGI2_STACK_ARGS:-} \
  > "$OUT/vllm_stack${MAGI2_STACK_SUFFIX:-}.log" 2>&1; tail -30 "$OUT/vllm_stack${MAGI2_STACK_SUFFIX:-}.log"
fi
if want dit_step; then
step "the whole MAGI-2 DiT step, plugin off vs on, eager / compiled / graph (MAGI2_DIT_ARGS: extra arguments)"
python3 -m benchmarks.dit_step --wheel "${MAGI2_VLLM_OMNI_WHEEL:?no vllm-omni wheel in the wheelhouse}" \
  --out "$OUT/dit_step_${tag}${MAGI2_DIT_SUFFIX:-}.json" ${MAGI2_DIT_ARGS:-} > "$OUT/dit_step${MAGI2_DIT_SUFFIX:-}.log" 2>&1
echo "dit_step exit $?"; tail -40 "$OUT/dit_step${MAGI2_DIT_SUFFIX:-}.log"
fi
if want demo; then
step "demo"
python3 -m magi2_core.cli demo --device cuda --wide 2>&1 | tail -30
fi
if want norm; then
step "rmsnorm + sink benchmarks (final default tiles)"
python3 -m benchmarks.rmsnorm --json "$OUT/rmsnorm_${tag}.json" > "$OUT/rmsnorm.log" 2>&1; tail -8 "$OUT/rmsnorm.log"
python3 -m benchmarks.sink_correction --json "$OUT/sink_correction_${tag}.json" > "$OUT/sink.log" 2>&1; tail -6 "$OUT/sink.log"
fi
if want attention; then
step "attention benchmark (final rule)"
python3 -m benchmarks.attention --quick --out "$OUT/attention_${tag}.json" > "$OUT/attention.log" 2>&1; tail -22 "$OUT/attention.log"
fi
if want block; then
step "block benchmark (4-layer MAGI-2 stack, strict)"
python3 -m benchmarks.block --out "$OUT/block_${tag}.json" > "$OUT/block.log" 2>&1; tail -70 "$OUT/block.log"
fi
if want fa4; then
step "FA4 benchmark (resolved vs raw FA3, FA3 + correction, FA4 native sink; JIT latency)"
python3 -m benchmarks.attention_fa4 --quick --out "$OUT/attention_fa4_${tag}.json" > "$OUT/attention_fa4.log" 2>&1; tail -40 "$OUT/attention_fa4.log"
fi
if want vllm_omni; then
step "vllm-omni integration MoE stack"
python3 -m benchmarks.vllm_omni_moe --out "$OUT/vllm_omni_moe_${tag}.json" > "$OUT/vllm_omni_moe.log" 2>&1; tail -30 "$OUT/vllm_omni_moe.log"
fi
if want sweep; then
step "MoE kernel variants sweep"
python3 -m benchmarks.moe_sweep --out "$OUT/moe_sweep_${tag}.json" ${MAGI2_SWEEP_ARGS:-} > "$OUT/moe_sweep.log" 2>&1; tail -40 "$OUT/moe_sweep.log"
fi
if want cli; then
step "CLI on the GPU machine"
( time python3 -m magi2_core.cli --help > /dev/null ) 2>&1 | grep real
python3 -m magi2_core.cli env > "$OUT/env.txt" 2>&1; head -40 "$OUT/env.txt"
python3 -m magi2_core.cli demo --device cuda --wide 2>&1 | tail -30
fi
if want dispatch; then
step "dispatch overhead against a no-op provider, on this host's CPU and with GPU inputs"
python3 -m benchmarks.dispatch --out "$OUT/dispatch_cpu_${tag}host.json" 2>&1 | tail -6
python3 -m benchmarks.dispatch --device cuda --out "$OUT/dispatch_cuda.json" 2>&1 | tail -6
fi
if want moe; then
step "MoE: the table's kernel vs the previous kernel (one_kernel) and torch _grouped_mm, eager and graph"
python3 -m benchmarks.moe --out "$OUT/moe_${tag}.json" --tokens 512 4096 14601 --iters 20 > "$OUT/moe.log" 2>&1; tail -14 "$OUT/moe.log"
fi
if want mhc; then
step "mHC: fused mhc_pre + mhc_mix vs vllm-omni's native form, eager and compiled"
python3 -m benchmarks.mhc --json "$OUT/mhc_${tag}.json" ${MAGI2_VLLM_OMNI_WHEEL:+--wheel "$MAGI2_VLLM_OMNI_WHEEL"} > "$OUT/mhc.log" 2>&1; echo "mhc exit $?"; tail -12 "$OUT/mhc.log"
fi
fused_op() {  # $1: the op (its kernel tests and its benchmark share the name); $2: what the step says
  step "$2: the kernel's tests (the kit on a fresh seed among them), then fused vs vllm-omni's native form"
  python3 -m pytest -q -p no:cacheprovider "backends/triton/tests/test_$1_kernel.py" -rfEs \
    > "$OUT/$1_tests.log" 2>&1; echo "$1 tests exit $?"; tail -4 "$OUT/$1_tests.log"
  python3 -m "benchmarks.$1" --json "$OUT/$1_${tag}.json" > "$OUT/$1.log" 2>&1
  echo "$1 exit $?"; grep -v Warning "$OUT/$1.log" | tail -6
}
want qk_rope && fused_op qk_norm_rope "q/k norm + RoPE"
want output_gate && fused_op output_gate "output gate"
if want mhc_sweep; then
step "mHC: mhc_pre's logits-kernel launches (ieee, tf32x3, bf16x3), each judged by the contract"
python3 -m benchmarks.mhc_sweep --json "$OUT/mhc_sweep_${tag}.json" > "$OUT/mhc_sweep.log" 2>&1
echo "mhc_sweep exit $?"; grep -v Warning "$OUT/mhc_sweep.log" | head -20
fi
if want mhc_diagnose; then
step "mHC: the split-BF16 logits kernel taken apart (variants, three runs each, against float64)"
python3 -m benchmarks.mhc_split_diagnose --json "$OUT/mhc_split_diagnose_${tag}.json" > "$OUT/mhc_split_diagnose.log" 2>&1
echo "mhc_split_diagnose exit $?"; grep -v Warning "$OUT/mhc_split_diagnose.log" | tail -30
fi
if want moe_raw; then
step "MoE: raw weights read in place vs prepared vs re-packed per call (MAGI2_RAW_ARGS: extra arguments)"
python3 -m benchmarks.moe_raw --out "$OUT/moe_raw_${tag}.json" ${MAGI2_RAW_ARGS:-} > "$OUT/moe_raw.log" 2>&1
echo "moe_raw exit $?"; tail -12 "$OUT/moe_raw.log"
fi
if want moe_align; then
step "MoE route alignment: atomic vs stable kernels vs torch; the call in default and deterministic mode"
python3 -m benchmarks.moe_align --out "$OUT/moe_align_${tag}.json" > "$OUT/moe_align.log" 2>&1; tail -6 "$OUT/moe_align.log"
fi
if want moe_tests; then
step "MoE GPU tests only"
gpu_tests gpu_tests_moe backends/triton/tests/test_moe_fused.py backends/triton/tests/test_moe_gluon.py backends/triton/tests/test_moe_prepared.py
fi
if want moe_layers; then
step "MoE: N distinct layers in turn through the public op"
python3 -m benchmarks.moe --out "$OUT/moe_layers_${tag}.json" --tokens 512 4096 14601 --layers 4 --skip-12 --iters 20 > "$OUT/moe_layers.log" 2>&1; tail -30 "$OUT/moe_layers.log"
fi
# tune and profile_check read no user profile of this machine (their own XDG cache) and share FA4's
# compile cache, so the checks after the tune pay no JIT compilation.
tune_cache=${TMPDIR:-/tmp}/magi2-tune-cache  # outside $OUT: the FA4 compile cache is many small files
tune_env=(XDG_CACHE_HOME="$tune_cache" FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
          FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$tune_cache/fa4")
profile_check() {  # $1: label; $2: MAGI2_PROFILE ("" = the shipped one for this device)
  env "${tune_env[@]}" MAGI2_PROFILE="$2" python3 -m benchmarks.profile_check --out "$OUT/profile_check_$1_${tag}.json" \
    ${MAGI2_CHECK_ARGS:-} > "$OUT/profile_check_$1.log" 2>&1; echo "profile_check exit $?" >> "$OUT/profile_check_$1.log"
  grep -E "FAIL|^profile |exit" "$OUT/profile_check_$1.log" | tail -20
}
if want profile_check; then
step "profile check before any tune: what this device gets, the nvidia-h200 profile, the generic one (resolved vs every eligible provider)"
profile_check shipped ""
profile_check h200 nvidia-h200
profile_check generic generic
fi
if want tune; then
step "magi2 tune over the default grid (timed; target <= 300 s), then the resolved call vs every eligible provider under it"
t0=$(date +%s)
env "${tune_env[@]}" python3 -m magi2_core.cli tune --fresh --out "$OUT/profile_tuned_${tag}.json" --note "commit $MAGI2_GIT_COMMIT" \
  ${MAGI2_TUNE_ARGS:-} \
  > "$OUT/tune.log" 2>&1; echo "tune exit $? in $(( $(date +%s) - t0 )) s" >> "$OUT/tune.log"
tail -6 "$OUT/tune.log"
[ -f "$OUT/profile_tuned_${tag}.json" ] && profile_check tuned "$OUT/profile_tuned_${tag}.json"
fi
step "done"
# One archive of the logs beside the JSON results (MAGI2_PACK_LOGS=1), for copying them off the machine.
if [ "${MAGI2_PACK_LOGS:-0}" = 1 ]; then
  # nullglob: a kind of log that this run did not write must not stop the archive (and leave the logs)
  ( cd "$OUT" && shopt -s nullglob && logs=(./*.log ./*.xml ./*.txt) && [ ${#logs[@]} -gt 0 ] \
      && tar czf logs.tar.gz "${logs[@]}" && rm -f "${logs[@]}" )
fi
