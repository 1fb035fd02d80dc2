#!/usr/bin/env bash
# On a GPU host: per-kernel times of one train-graph and one collect-graph replay (tools/profile_step.py
# under Nsight Compute). Usage: OUT=<dir> bash tools/gpu_profile.sh [--set net.gemm=cublas ...]
# Writes $OUT/ncu_train.csv, $OUT/ncu_collect.csv and prints the tables ($OUT/profile.txt).
# NCU_DETAIL=<regex> adds a pass over the train graph's kernels whose names match (e.g.
# NCU_DETAIL='targets_loss|gemm_n'): ncu's launch, occupancy, scheduler and warp-stall sections, as
# text in $OUT/ncu_detail.txt (why a kernel takes its time, not only how long).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudarl-profile}; mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
NCU=${NCU:-ncu}
for g in train collect; do
  timeout 240 "$NCU" --profile-from-start off --clock-control none --cache-control none --csv --page raw \
    --print-units base --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread \
    python3 tools/profile_step.py --graph "$g" "$@" > "$OUT/ncu_$g.csv" 2> "$OUT/ncu_$g.err" || { echo "ncu $g failed:"; tail -5 "$OUT/ncu_$g.err"; }
done
if [ -n "${NCU_DETAIL:-}" ]; then
  timeout 300 "$NCU" --profile-from-start off --clock-control none --kernel-name "regex:${NCU_DETAIL}" \
    --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis python3 tools/profile_step.py --graph train "$@" > "$OUT/ncu_detail.txt" \
    2> "$OUT/ncu_detail.err" || { echo "ncu detail failed:"; tail -5 "$OUT/ncu_detail.err"; }
fi
python3 tools/profile_step.py --summarize "$OUT/ncu_train.csv" "$OUT/ncu_collect.csv" --out "$OUT/profile.json" | tee "$OUT/profile.txt"
