#!/bin/bash
# Full-size validate of the converted SmolLM2 module, one check per process so each gets its own time:
#   pitcheck convert smollm2 --out conv --dtype float64 [--mode MODE]
#   bash results/smollm2/validate/validate.sh float32 [CHECK ...] [-- EXTRA OPTIONS]
# Writes val_<dtype>_<check>.json / .txt here (or in $VALIDATE_OUT) and appends "<check> rc=.. seconds=.." to
# val_<dtype>.times. Without a converted file (PITCHECK_CONVERTED=) the module is converted in each process in
# the mode $PITCHECK_CONVERT_MODE (pitcheck.sources.pretrained.factory).
cd "$(git rev-parse --show-toplevel)" || exit 2
export PITCHECK_CONVERTED=${PITCHECK_CONVERTED-conv/converted.safetensors}  # set but empty: convert in each process
dtype=$1; shift
checks=(); while [ $# -gt 0 ] && [ "$1" != "--" ]; do checks+=("$1"); shift; done; shift
[ ${#checks[@]} -eq 0 ] && checks=(contract penrose reference gradients retraction checkpoint bad_input scale trajectory conditioning)
here=${VALIDATE_OUT:-results/smollm2/validate}; mkdir -p "$here"
for c in "${checks[@]}"; do
  s=$(date +%s.%N)
  .venv/bin/pitcheck validate pitcheck.sources.pretrained.factory:make_smollm2 --dtype "$dtype" --vocab 49152 --dim 576 \
    --checks "$c" --timeout 1500 "$@" --json "$here/val_${dtype}_$c.json" > "$here/val_${dtype}_$c.txt" 2>&1
  rc=$?; e=$(date +%s.%N)
  echo "$c rc=$rc seconds=$(echo "$e - $s" | bc) $*" >> "$here/val_${dtype}.times"
done
