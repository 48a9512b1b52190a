#!/usr/bin/env bash
# Every check that needs a CUDA GPU, in one call that ends within about 8 minutes (a lent GPU's time is short):
#   OUT=results/gpu/raw bash scripts/gpu_check.sh
# the CUDA tests, native float8 against the emulation, `run` in each precision, retraction and step costs in
# GEMM units, `validate` of the reference module on CUDA, and a 2-rank NCCL run. Each section has its own time
# limit, so one that hangs costs its limit and no more (a run stopped by its limit saves its checkpoint and
# the script stops: pitcheck treats SIGTERM as an interruption, not an error). Runs from the source tree (PYTHONPATH), on the
# machine's own torch.
set -u
OUT=${OUT:-results/gpu/raw}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
section() { echo; echo "== $1 (t=$(( $(date +%s) - START )) s)"; }
START=$(date +%s)
{
  nvidia-smi -L 2>&1
  $PY -c "import torch, numpy, ml_dtypes, threadpoolctl; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA', 'numpy', numpy.__version__, 'ml_dtypes', ml_dtypes.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
{
  section "pytest: CUDA tests, native float8, engine, placements"
  timeout -k 10 100 $PY -m pytest -q -p no:cacheprovider -o addopts="" --tb=line -rf tests/test_torch_backend.py tests/test_native_float8.py \
      tests/test_engine.py tests/test_placement.py 2>&1 | tail -60
  section "native float8 against the emulation"
  timeout -k 10 70 $PY scripts/native_float8_check.py --out "$OUT/native_float8.json" | tail -30
  section "runs on CUDA (8192 x 128, 200 steps, qr, Adam)"
  timeout -k 10 100 $PY scripts/gpu_runs.py --steps 200 --out "$OUT/runs.json"
  section "retractions and steps in GEMM units"
  timeout -k 10 110 $PY scripts/gpu_bench.py --out "$OUT/bench.json"
  for dtype in float32 bfloat16; do
    section "validate pitcheck.nn:make --device cuda --dtype $dtype"
    timeout -k 10 45 $PY -m pitcheck.cli validate pitcheck.nn:make --device cuda --dtype $dtype --json "$OUT/validate_$dtype.json" 2>&1 | tail -20
  done
  section "2 ranks under NCCL on $(nvidia-smi -L 2>/dev/null | wc -l) GPU(s)"
  timeout -k 10 40 $PY -m pitcheck.cli run --backend torch --device cuda --precision fp32 --shards 2 --vocab 1000 --dim 16 \
      --steps 20 --out /tmp/nccl-run --no-progress 2>&1 | tail -8
  section done
} 2>&1 | tee "$OUT/log.txt"
