#!/usr/bin/env bash
# Run pytest COPIES times side by side, ROUNDS times, with a GEMM loop beside them on the GPU: a race between
# streams shows only when the GPU is shared (another process's time slice reorders the work), so a test that
# passes alone can fail here. Each copy's outcome is counted; the logs of failing copies are kept.
#   COPIES=12 ROUNDS=2 OUT=<dir> bash tools/gpu_stress.sh [pytest arguments, e.g. a test node]
# The GEMM loop runs only where CuPy and a GPU are (NO_LOAD=1 leaves it out). Exits 1 if any copy failed.
# Found this way: the cuBLAS warm-up race (docs/perf-notes.md, twenty-second session): 2-10 failing copies in 37.
set -uo pipefail
cd "$(dirname "$0")/.."
COPIES=${COPIES:-12}; ROUNDS=${ROUNDS:-2}; OUT=${OUT:-/tmp/cudarl-stress}
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
LOAD=""
if [ "${NO_LOAD:-0}" != 1 ] && python3 -c "import cupy; cupy.cuda.runtime.getDeviceCount()" 2>/dev/null; then
  python3 -c "import cupy as cp, time
a = cp.ones((8192, 8192), cp.float32); t = time.time()
while time.time() - t < 3600: a @ a; cp.cuda.Device().synchronize()" &
  LOAD=$!
  trap 'kill "$LOAD" 2>/dev/null' EXIT  # an interrupted run leaves no GEMM loop behind
fi
failed=0
for ((round = 1; round <= ROUNDS; round++)); do
  pids=()
  for ((k = 1; k <= COPIES; k++)); do
    python3 -m pytest -q -p no:cacheprovider "$@" > "$OUT/r${round}_c$k.log" 2>&1 &
    pids+=($!)
  done
  bad=0
  for k in "${!pids[@]}"; do
    log="$OUT/r${round}_c$((k + 1)).log"
    if wait "${pids[$k]}"; then rm -f "$log"; else bad=$((bad + 1)); echo "  round $round copy $((k + 1)) failed: $log"; fi
  done
  echo "round $round: $((COPIES - bad)) of $COPIES copies passed$([ -n "$LOAD" ] && echo ", a GEMM loop beside them")"
  failed=$((failed + bad))
done
echo "stress: $failed failing copies in $((COPIES * ROUNDS))"
[ "$failed" -eq 0 ]
