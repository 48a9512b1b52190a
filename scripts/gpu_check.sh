#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in sections a lent GPU's short time can be spent on:
#   OUT=results/gpu/raw bash scripts/gpu_check.sh                 # every section, in order
#   OUT=results/gpu/raw bash scripts/gpu_check.sh step validate   # only the named sections
# Sections: tests (the CUDA tests), float8 (native float8 against the emulation), runs (`run` in each
# precision), bench (retraction and step costs in GEMM units), step (where a run step's time goes, the shadow on
# the GPU against the CPU), validate (pitcheck.nn on CUDA, fp32 and bf16), nccl (sharded runs under NCCL: more
# ranks than GPUs must be a one-line refusal), compare (the quick grid with its torch cells on CUDA), f8tests
# (tests/numerics/test_native_float8.py, a line per failure), batched (the batched-cell tests, which ran into the GPU
# before `auto` kept small cells on the CPU), zoo (every module of tests/zoo through `pitcheck validate --device
# cuda` in float32 and bfloat16: correct_* must pass, broken_* fail their check; $OUT/zoo/zoo.md, whose
# timeouts name their slowest phases), runloop (the run loop's costs and accuracy on CUDA: `pitcheck bench --device cuda`
# with a run step, a metrics row and a commit timed apart, on the host's gradient stream at 8192 x 128 and 32768 x 512
# and on the counter stream drawn on the GPU at 32768 x 512 and 49152 x 576; each exact map's distance from the manifold on
# CUDA against the CPU; the counter-based normals and the float64 factorisations on CUDA; a whole 500-step run at
# 32768 x 512 timed as a user starts it; the deferred checks' tests run in `tests`), grid (`pitcheck bench --grid
# --device cuda`: the default compare grid's torch cells on the GPU one after another, beside the CPU pool's
# wall for the same cells, and which finishes first), segment (a 1000-step run at 49152 x 576 as a user starts it,
# the measured segment a 10^5-step run is estimated from; then one draw of normals on the host, unfused and fused
# on CUDA), profile (scripts/measurements/gpu_run_profile.py: a model step, a whole run step, a metrics row and a
# commit at 32768 x 512 under torch.profiler, their kernel time against their wall and their launches a step).
# Each section has its own time limit (LIMIT below), so one that hangs costs its limit and no more (a run
# stopped by its limit saves its checkpoint and the script stops: pitcheck treats SIGTERM as an interruption,
# not an error). Runs from the source tree (PYTHONPATH), on the machine's own torch. DRY=1 prints the sections
# with their limits and checks the script's helpers on this machine, without a GPU, and runs nothing else.
set -u
OUT=${OUT:-results/gpu/raw}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
START=$(date +%s)
header() { echo; echo "== $1 (t=$(( $(date +%s) - START )) s)"; }
# each section's time limit in seconds (validate: two runs of half each); a lent machine's call is cut at
# CALL_LIMIT, so the sections named in one call should sum below it
declare -A LIMIT=([tests]=180 [float8]=70 [runs]=100 [bench]=110 [step]=150 [validate]=100 [nccl]=45 [compare]=120
                  [f8tests]=45 [batched]=170 [zoo]=300 [runloop]=300 [grid]=200 [segment]=120 [profile]=60)
CALL_LIMIT=${CALL_LIMIT:-600}
# zoo: validations at once (each its own process and CUDA context) and each one's own limit
ZOO_JOBS=${ZOO_JOBS:-8}
ZOO_TIMEOUT=${ZOO_TIMEOUT:-90}
PYTEST=(-m pytest -q -p no:cacheprovider -o addopts="" --tb=line -rf)

tests() {
  header "pytest: CUDA tests, the shadow's placement, engine, placements, deferred checks, the NCCL refusal"
  timeout -k 10 ${LIMIT[tests]} $PY "${PYTEST[@]}" tests/model/test_torch_backend.py tests/trajectory/test_shadow_device.py \
      tests/model/test_engine.py tests/numerics/test_placement.py tests/trajectory/test_speculation.py \
      tests/trajectory/test_checkpoint_thread.py tests/model/sharded/test_sharded.py::test_nccl_with_fewer_gpus_than_ranks_is_refused_before_any_rank_starts \
      2>&1 | tail -40
}
float8() {
  header "native float8 against the emulation"
  timeout -k 10 ${LIMIT[float8]} $PY scripts/studies/native_float8_check.py --out "$OUT/native_float8.json" | tail -30
}
runs() {
  header "runs on CUDA (8192 x 128, 200 steps, qr, Adam)"
  timeout -k 10 ${LIMIT[runs]} $PY scripts/studies/gpu_runs.py --steps 200 --out "$OUT/runs.json"
}
bench() {
  header "retractions and steps in GEMM units"
  timeout -k 10 ${LIMIT[bench]} $PY scripts/studies/gpu_bench.py --out "$OUT/bench.json"
}
step() {
  header "a run step at 8192 x 128 fp32 qr Adam: the shadow on the GPU, on the CPU, none"
  timeout -k 10 ${LIMIT[step]} $PY scripts/measurements/gpu_step_profile.py --out "$OUT/step_profile.json" 2>&1 | head -60
}
validate() {
  for dtype in float32 bfloat16; do
    header "validate pitcheck.nn:make --device cuda --dtype $dtype"
    timeout -k 10 $(( LIMIT[validate] / 2 )) $PY -m pitcheck.cli validate pitcheck.nn:make --device cuda --dtype $dtype \
        --json "$OUT/validate_$dtype.json" 2>&1 | tail -20
  done
}
nccl() {
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  header "2 ranks under NCCL on $gpus GPU(s)"
  timeout -k 10 ${LIMIT[nccl]} $PY -m pitcheck.cli run --backend torch --device cuda --precision fp32 --shards 2 --vocab 1000 \
      --dim 16 --steps 20 --out /tmp/nccl-run --force --no-progress 2>&1 | tail -8
  echo "rc ${PIPESTATUS[0]}"
}
compare() {
  header "compare --quick, torch cells on CUDA (auto)"
  local t0=$SECONDS
  rm -rf /tmp/quick-cuda
  timeout -k 10 ${LIMIT[compare]} $PY -m pitcheck.cli compare --quick --out /tmp/quick-cuda --no-progress 2>&1 | tail -25
  echo "compare wall $(( SECONDS - t0 )) s"
  cp /tmp/quick-cuda/summary.csv "$OUT/compare_quick_summary.csv" 2>/dev/null
  echo "cells by device:"; grep -ho '"device": *"[^"]*"' /tmp/quick-cuda/cells/*/manifest.json | sort | uniq -c
}
batched() {
  header "pytest: batched cells, stack failures, the draw memo (on the GPU machine's CPU; xdist where it is there)"
  local par=()
  $PY -c "import xdist" 2>/dev/null && par=(-n 8)
  timeout -k 10 ${LIMIT[batched]} $PY "${PYTEST[@]}" "${par[@]}" tests/trajectory/test_batched.py tests/trajectory/test_stack_failures.py \
      tests/model/test_draw_memo.py 2>&1 | tail -30
}
f8tests() {
  header "tests/numerics/test_native_float8.py and test_scaling_device.py (one line per failure)"
  timeout -k 10 ${LIMIT[f8tests]} $PY "${PYTEST[@]}" tests/numerics/test_native_float8.py tests/numerics/test_scaling_device.py 2>&1 | tail -30
}
zoo() {
  header "validate tests/zoo --device cuda, float32 and bfloat16 ($ZOO_JOBS at once, ${ZOO_TIMEOUT} s a target)"
  timeout -k 10 ${LIMIT[zoo]} $PY scripts/studies/validate_zoo.py --device cuda --dtypes float32,bfloat16 --jobs "$ZOO_JOBS" \
      --timeout "$ZOO_TIMEOUT" --out "$OUT/zoo" 2>&1 | tail -80
  echo "rc ${PIPESTATUS[0]} (0: every outcome as expected; 1: see UNEXPECTED; 124: the section's limit)"
  # the summary as far as it got: zoo.md is rewritten after every target
  grep -h '^Unexpected outcomes' "$OUT/zoo/zoo.md" 2>/dev/null || echo "no $OUT/zoo/zoo.md"
}
runloop() {
  header "the run loop on CUDA: bench --device cuda (step, metrics row, commit apart); accuracy against the CPU; normals, metrics on the device"
  # the host's numpy gradient stream, then the counter stream drawn on the GPU (--gradient-stream counter)
  timeout -k 10 70 $PY -m pitcheck.cli bench --device cuda --shape 8192x128 --shape 32768x512 \
      --no-peers --retractions qr,cholqr2,polar --rounds 2 --json "$OUT/bench_cuda.json" 2>&1 | tail -45
  timeout -k 10 95 $PY -m pitcheck.cli bench --device cuda --shape 32768x512 --shape 49152x576 \
      --no-peers --retractions qr,cholqr2 --rounds 2 --gradient-stream counter --json "$OUT/bench_cuda_counter.json" 2>&1 | tail -30
  timeout -k 10 40 $PY scripts/measurements/device_accuracy.py --shape 32768x512 --out "$OUT/device_accuracy.json" 2>&1 | tail -15
  timeout -k 10 40 $PY "${PYTEST[@]}" --junitxml="$OUT/runloop_tests.xml" tests/numerics/test_counter_normal.py \
      tests/numerics/test_counter_normal_fused.py tests/numerics/test_factors_float64.py tests/model/test_counter_stream.py tests/numerics/test_device_metrics.py 2>&1 | tail -10
  # a whole run as a user starts it: 32768 x 512 fp32 cholqr2, the float64 shadow, the default records, its
  # checks deferred (on by default on CUDA); wall time of 500 steps with its records and commits (start-up included)
  rm -rf /tmp/runloop-whole
  local t0
  t0=$(date +%s%N)
  timeout -k 10 50 $PY -m pitcheck.cli run --backend torch --device cuda --precision fp32 --retraction cholqr2 \
      --vocab 32768 --dim 512 --steps 500 --gradient-stream counter --out /tmp/runloop-whole --no-progress 2>&1 | tail -5
  echo "whole run rc ${PIPESTATUS[0]} wall $(( ($(date +%s%N) - t0) / 1000000 )) ms (500 steps; records and commits included)"
  tail -2 /tmp/runloop-whole/metrics.csv 2>/dev/null | cut -c1-120
}
segment() {
  header "a 1000-step segment at 49152 x 576 fp32 cholqr2, shadow and default records, timed as a user starts it"
  rm -rf /tmp/runloop-segment
  local t0
  t0=$(date +%s%N)
  timeout -k 10 $(( LIMIT[segment] - 30 )) $PY -m pitcheck.cli run --backend torch --device cuda --precision fp32 --retraction cholqr2 \
      --vocab 49152 --dim 576 --steps 1000 --gradient-stream counter --out /tmp/runloop-segment --no-progress 2>&1 | tail -5
  echo "segment rc ${PIPESTATUS[0]} wall $(( ($(date +%s%N) - t0) / 1000000 )) ms (1000 steps; records and commits included)"
  tail -2 /tmp/runloop-segment/metrics.csv 2>/dev/null | cut -c1-120
  # one draw of normals: numpy on the host, counter_normal unfused (a kernel an operation) and fused (one Triton kernel)
  timeout -k 10 30 $PY scripts/measurements/counter_normal_timing.py 3 2>&1 | tail -12
}
profile() {
  header "where a run step's time goes at 32768 x 512 (torch.profiler: kernel time, host time, launches a step)"
  timeout -k 10 ${LIMIT[profile]} $PY scripts/measurements/gpu_run_profile.py --shape 32768x512 --steps 10 --rows 10 \
      --out "$OUT/run_profile.json" 2>&1 | grep -v USDT | head -120
}
grid() {
  header "the default grid's torch cells on CUDA against the CPU pool (bench --grid --device cuda)"
  timeout -k 10 ${LIMIT[grid]} $PY -m pitcheck.cli bench --device cuda --shape 8192x128 --no-peers --no-steps \
      --retractions qr --rounds 2 --grid --json "$OUT/bench_grid_cuda.json" 2>&1 | tail -20
}

SECTIONS=("$@")
[ ${#SECTIONS[@]} -eq 0 ] && SECTIONS=(tests float8 runs bench step validate nccl compare f8tests batched zoo)
TOTAL=0
for name in "${SECTIONS[@]}"; do
  case $name in
    tests|float8|runs|bench|step|validate|nccl|compare|f8tests|batched|zoo|runloop|grid|segment|profile) TOTAL=$(( TOTAL + LIMIT[$name] )) ;;
    *) echo "unknown section $name" >&2; exit 2 ;;
  esac
done
if [ "$TOTAL" -gt "$CALL_LIMIT" ]; then
  echo "warning: the sections' limits sum to $TOTAL s, over a call's $CALL_LIMIT s: the last ones may be cut; name fewer" >&2
fi
if [ -n "${DRY:-}" ]; then
  for name in "${SECTIONS[@]}"; do echo "$name ${LIMIT[$name]} s"; done
  echo "total $TOTAL s of $CALL_LIMIT s"
  declare -F "${SECTIONS[@]}" > /dev/null || { echo "a section has no function" >&2; exit 2; }
  $PY scripts/studies/validate_zoo.py --help > /dev/null || exit 2
  exit 0
fi

{
  nvidia-smi -L 2>&1
  $PY -c "import torch, numpy, ml_dtypes, threadpoolctl; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA', 'numpy', numpy.__version__, 'ml_dtypes', ml_dtypes.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
{
  for name in "${SECTIONS[@]}"; do "$name"; done
  header done
} 2>&1 | tee -a "$OUT/log.txt"
