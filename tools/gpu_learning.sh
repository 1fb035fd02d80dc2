#!/usr/bin/env bash
# One GPU call's learning check (issue 8): every task, both heads, 3 seeds, runs spread over worker
# processes under MPS. Writes $OUT/learning_check.json and $OUT/results.md (docs/results.md's text).
#   CUDARL_COMMIT=<sha> OUT=<dir> bash tools/gpu_learning.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudarl-learning}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONFAULTHANDLER=1
. tools/mps.sh
mps_start
timeout "${LEARNING_LIMIT_S:-480}" python3 tools/learning_check.py --seeds "${SEEDS:-3}" --workers "${WORKERS:-8}" \
  --out "$OUT/learning_check.json" --results-md "$OUT/results.md" > "$OUT/learning.log" 2>&1
rc=$?
mps_stop
tail -n 25 "$OUT/learning.log"
exit $rc
