#!/usr/bin/env bash
# On a GPU host: per-kernel times of one train-graph and one collect-graph replay (tools/profile_step.py
# under Nsight Compute). Usage: OUT=<dir> bash tools/gpu_profile.sh [--set net.gemm=cublas ...]
# Writes $OUT/ncu_train.csv, $OUT/ncu_collect.csv and prints the tables ($OUT/profile.txt).
# NCU_DETAIL=<regex> adds a pass over the train graph's kernels whose names match (e.g.
# NCU_DETAIL='targets_loss|gemm_n'): ncu's launch, occupancy, scheduler and warp-stall sections, as
# text in $OUT/ncu_detail.txt (why a kernel takes its time, not only how long), and the stall samples
# per source line and per SASS instruction in $OUT/ncu_source_{cuda,sass}.csv.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudarl-profile}; mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
NCU=${NCU:-ncu}
METRICS=$(python3 tools/profile_step.py --metrics) || { echo "tools/profile_step.py --metrics failed"; exit 1; }
for g in ${GRAPHS:-train collect}; do  # GRAPHS=train: the train graph only
  timeout 240 "$NCU" --profile-from-start off --clock-control none --cache-control none --csv --page raw \
    --print-units base --metrics "$METRICS" \
    python3 tools/profile_step.py --graph "$g" "$@" > "$OUT/ncu_$g.csv" 2> "$OUT/ncu_$g.err" || { echo "ncu $g failed:"; tail -5 "$OUT/ncu_$g.err"; }
done
if [ -n "${NCU_DETAIL:-}" ]; then
  # -lineinfo (CUDARL_LINEINFO=1) so the source page maps each stall sample to a line of cuda_src.
  CUDARL_LINEINFO=1 timeout 300 "$NCU" --profile-from-start off --clock-control none --kernel-name "regex:${NCU_DETAIL}" \
    --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SourceCounters --import-source yes -f -o "$OUT/ncu_detail" \
    python3 tools/profile_step.py --graph train "$@" > "$OUT/ncu_detail.log" 2>&1 || { echo "ncu detail failed:"; tail -5 "$OUT/ncu_detail.log"; }
  "$NCU" -i "$OUT/ncu_detail.ncu-rep" --print-details all > "$OUT/ncu_detail.txt" 2>&1
  # per source line and per SASS instruction: warp-stall samples (where the kernel's warps wait)
  "$NCU" -i "$OUT/ncu_detail.ncu-rep" --page source --csv --print-source cuda > "$OUT/ncu_source_cuda.csv" 2>&1
  "$NCU" -i "$OUT/ncu_detail.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_source_sass.csv" 2>&1
fi
python3 tools/profile_step.py --summarize $(for g in ${GRAPHS:-train collect}; do echo "$OUT/ncu_$g.csv"; done) --out "$OUT/profile.json" | tee "$OUT/profile.txt"
