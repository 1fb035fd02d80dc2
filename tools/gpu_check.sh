#!/usr/bin/env bash
# On a GPU host: run the GPU-marked tests and every benchmark, write docs/gpu-report.md.
#   CUDARL_COMMIT=<sha> OUT=<dir> bash tools/gpu_check.sh [--torch-compile] [--only-tests] [--poison]
# Optional: TEST_PATHS (default tests; the test files under it), PARALLEL (default 4 test processes), BENCHES (default tools/bench_*.py),
# BENCH_ARGS (appended to every benchmark's command line; e.g. BENCHES=tools/bench_step.py BENCH_ARGS="--no-encoders --no-epoch
# --no-net-variants --no-dw-variants" for the single step and its PyTorch arms in about a minute; BENCH_ARGS_<name>, e.g.
# BENCH_ARGS_bench_population="--sizes 64 --arms joined-probe,vmap", replaces it for that benchmark), PYTEST_ARGS, DEADLINE_S (seconds
# from the start by which the benchmarks must end, so the report is still written inside a device call's
# limit: each benchmark gets at most what is left, less 20 s for the report; one with under 20 s left is
# skipped and says so).
# Logs and the report go to $OUT (default: /tmp/cudarl-gpu) and the report also to docs/gpu-report.md.
# Prints a short table last. Budget: under 8 minutes on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudarl-gpu}
BENCH_DIR=${BENCH_DIR:-/tmp/cudarl-bench}
mkdir -p "$OUT" "$BENCH_DIR"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
COMMIT=${CUDARL_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
EXTRA=""; ONLY_TESTS=0
for a in "$@"; do
  case "$a" in
    --torch-compile) EXTRA="--torch-compile" ;;
    --only-tests) ONLY_TESTS=1 ;;
    --poison) export CUDARL_POISON_POOL=1 ;;  # each GPU test's memory pool filled with 0xFF first (cudarl.testing.poison_pool)
  esac
done
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1 || true
echo "== GPU tests ($(cat "$OUT/gpu.txt"))"
# PARALLEL (default 4) pytest processes side by side on the GPU, the test files dealt round-robin: the
# whole suite in one process outgrew the 420 s limit at 25977c5 (it ran in 214 s as four). Their JUnit
# files are merged into $OUT/junit.xml (tools/junit_read.py --merge), their logs into $OUT/pytest.log.
mapfile -t FILES < <(find ${TEST_PATHS:-tests} -name 'test_*.py' | sort)
N=${PARALLEL:-4}
for ((k = 0; k < N; k++)); do
  group=(); for i in "${!FILES[@]}"; do (( i % N == k )) && group+=("${FILES[$i]}"); done
  [ ${#group[@]} -eq 0 ] && continue
  timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/junit_$k.xml" -o junit_family=xunit2 \
    ${PYTEST_ARGS:-} "${group[@]}" > "$OUT/pytest_$k.log" 2>&1 &
done
wait
cat "$OUT"/pytest_*.log > "$OUT/pytest.log"
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT"/pytest_*.log | tail -n 40
python3 tools/junit_read.py --merge "$OUT/junit.xml" "$OUT"/junit_*.xml
if [ "$ONLY_TESTS" = 0 ]; then
  : > "$OUT/bench.log"
  for b in ${BENCHES:-tools/bench_*.py}; do
    name=$(basename "$b" .py)
    limit=240
    if [ -n "${DEADLINE_S:-}" ]; then
      left=$(( DEADLINE_S - ($(date +%s) - start) - 20 ))
      [ "$left" -lt "$limit" ] && limit=$left
      if [ "$limit" -lt 20 ]; then echo "== $name: skipped, ${limit} s left before DEADLINE_S" | tee -a "$OUT/bench.log"; continue; fi
    fi
    echo "== $name (limit ${limit} s)" | tee -a "$OUT/bench.log"
    own="BENCH_ARGS_$name"; args=${!own-${BENCH_ARGS:-}}  # a benchmark's own arguments, else the shared ones
    timeout "$limit" python3 "$b" --out "$BENCH_DIR/$name.json" $EXTRA $args 2>&1 | tee -a "$OUT/bench.log" | tail -n 30
  done
fi
python3 tools/gpu_report.py --commit "$COMMIT" --junit "$OUT/junit.xml" --bench-dir "$BENCH_DIR" $([ "${CUDARL_POISON_POOL:-}" = 1 ] && echo --poisoned) \
  --gpu-file "$OUT/gpu.txt" --seconds $(( $(date +%s) - start )) --out "$OUT/gpu-report.md" --bench-json "$OUT/bench.json"
cp "$OUT/gpu-report.md" docs/gpu-report.md 2>/dev/null || true
echo "== summary"
python3 tools/gpu_report.py --summary-only --junit "$OUT/junit.xml" --bench-dir "$BENCH_DIR"
