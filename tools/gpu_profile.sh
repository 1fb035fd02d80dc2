#!/usr/bin/env bash
# On a GPU host: per-kernel times of one train-graph and one collect-graph replay (tools/profile_step.py
# under Nsight Compute). Usage: OUT=<dir> bash tools/gpu_profile.sh [--set net.gemm=cublas ...]
# Writes $OUT/ncu_train.csv and $OUT/ncu_collect.csv, prints each graph's table as soon as its ncu pass
# ends (also in $OUT/profile.txt; a run cut short keeps the tables of the passes that finished), and
# at the end writes every graph's kernels to $OUT/profile.json. GRAPHS=train: the train graph only.
# NCU_DETAIL=<regex> adds a pass over the train graph's kernels (DETAIL_GRAPH=joined: the joined graph's)
# whose names match (e.g. NCU_DETAIL='targets_loss|gemm_n'): ncu's launch, occupancy, scheduler and
# warp-stall sections, as text in $OUT/ncu_detail.txt (why a kernel takes its time, not only how long),
# and the stall samples per source line and per SASS instruction in $OUT/ncu_source_{cuda,sass}.csv.
# Each graph's launch trace goes to $OUT/trace_<graph>.json (no ncu); with FLOOR=<bench_floor.json>
# (tools/bench_floor.py's output) tools/critical_path.py then prints the critical path of each graph,
# node by node with its bytes and FLOPs, and the floor model's bounds ($OUT/critical_<graph>.json).
# GRAPHS=joined (alone or beside the others, GRAPHS="train joined"): the joined population's train graph
# of MEMBERS=<P> members (default profile_step's, 64; tools/profile_step.py --graph joined, built as
# tools/bench_population.py's joined arm builds it: tools/bench_joined.py's build_joined), the --set
# arguments on top of that arm's config:
#   GRAPHS=joined MEMBERS=64 OUT=<dir> bash tools/gpu_profile.sh --set net.dw_gemm=one_kernel [--set net.tf32=true]
# writes $OUT/ncu_joined.csv and $OUT/trace_joined.json. NCU_TIMEOUT=<s> sets the limit of each graph's
# ncu pass (default 150 s); the joined graph's pass was not timed when this was written, so with
# GRAPHS=joined alone give it NCU_TIMEOUT=500 (its pass and its 25 s trace stay within 600 s).
# Time limits: 150 s a graph (NCU_TIMEOUT), 25 s a trace, 200 s the detail pass, 10 s each of its three
# exports: at most 580 s in all for the two default graphs, within the 600 s a device command may run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudarl-profile}; mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
NCU=${NCU:-ncu}
METRICS=$(python3 tools/profile_step.py --metrics) || { echo "tools/profile_step.py --metrics failed"; exit 1; }
# the graph's own arguments: --members for the joined graph only (train and collect as before)
graph_args() { GARGS=(--graph "$1"); [ "$1" = joined ] && [ -n "${MEMBERS:-}" ] && GARGS+=(--members "$MEMBERS"); return 0; }
: > "$OUT/profile.txt"
CSVS=()
for g in ${GRAPHS:-train collect}; do
  graph_args "$g"
  timeout "${NCU_TIMEOUT:-150}" "$NCU" --profile-from-start off --clock-control none --cache-control none --csv --page raw \
    --print-units base --metrics "$METRICS" \
    python3 tools/profile_step.py "${GARGS[@]}" "$@" > "$OUT/ncu_$g.csv" 2> "$OUT/ncu_$g.err" || { echo "ncu $g failed:"; tail -5 "$OUT/ncu_$g.err"; }
  python3 tools/profile_step.py --summarize "$OUT/ncu_$g.csv" | tee -a "$OUT/profile.txt"  # this graph's table now
  CSVS+=("$OUT/ncu_$g.csv")
done
for g in ${GRAPHS:-train collect}; do
  graph_args "$g"
  timeout 25 python3 tools/profile_step.py "${GARGS[@]}" --trace "$OUT/trace_$g.json" "$@" > "$OUT/trace_$g.log" 2>&1 \
    || { echo "trace $g failed:"; tail -5 "$OUT/trace_$g.log"; }
  if [ -n "${FLOOR:-}" ] && [ -s "$OUT/trace_$g.json" ]; then
    python3 tools/critical_path.py --trace "$OUT/trace_$g.json" --ncu "$OUT/ncu_$g.csv" --floor "$FLOOR" \
      --out "$OUT/critical_$g.json" | tee -a "$OUT/profile.txt"
  fi
done
if [ -n "${NCU_DETAIL:-}" ]; then
  graph_args "${DETAIL_GRAPH:-train}"
  rm -f "$OUT/ncu_detail.ncu-rep"  # the exports below read only this run's report
  # -lineinfo (CUDARL_LINEINFO=1) so the source page maps each stall sample to a line of cuda_src.
  CUDARL_LINEINFO=1 timeout 200 "$NCU" --profile-from-start off --clock-control none --kernel-name "regex:${NCU_DETAIL}" \
    --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SourceCounters --import-source yes -f -o "$OUT/ncu_detail" \
    python3 tools/profile_step.py "${GARGS[@]}" "$@" > "$OUT/ncu_detail.log" 2>&1 || { echo "ncu detail failed:"; tail -5 "$OUT/ncu_detail.log"; }
  if [ -f "$OUT/ncu_detail.ncu-rep" ]; then
    timeout 10 "$NCU" -i "$OUT/ncu_detail.ncu-rep" --print-details all > "$OUT/ncu_detail.txt" 2>&1
    # per source line and per SASS instruction: warp-stall samples (where the kernel's warps wait)
    timeout 10 "$NCU" -i "$OUT/ncu_detail.ncu-rep" --page source --csv --print-source cuda > "$OUT/ncu_source_cuda.csv" 2>&1
    timeout 10 "$NCU" -i "$OUT/ncu_detail.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_source_sass.csv" 2>&1
  fi
fi
# every graph in one JSON (their tables are printed above)
python3 tools/profile_step.py --summarize "${CSVS[@]}" --out "$OUT/profile.json" > /dev/null
