#!/usr/bin/env bash
# One GPU call's learning sweep (issue 8): C51 and IQN variants on builtin:regime, runs spread over
# worker processes; MPS is started when the machine allows it, so the processes' kernels overlap.
# Results: $OUT/sweep_c51.jsonl, $OUT/sweep_iqn.jsonl and the .md tables (partial if cut short).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONFAULTHANDLER=1
. tools/mps.sh
mps_start
LIMIT=${SWEEP_LIMIT_S:-500}
# Sweep 5: confirms sweep 4's candidates together, on both heads (sweep 4 tried each alone; its
# command: tools/gpu_sweep.sh at 0b82d05): batch 256 with 128-128 layers, epsilon over 20k steps, and all three.
# an array, passed as "${V[@]}": each word whole and unglobbed ([128,128] is a glob pattern)
V=(--variant base --variant "b256h128:agent.batch_size=256,net.hidden=[128,128]" --variant eps20k:agent.eps_steps=20000
   --variant "b256h128eps20k:agent.batch_size=256,net.hidden=[128,128],agent.eps_steps=20000")
for head in iqn c51; do
  timeout "$LIMIT" python3 tools/sweep.py --tasks regime --heads "$head" --seeds 3 --workers "${WORKERS:-6}" \
    --jsonl "$OUT/sweep_$head.jsonl" --md "$OUT/sweep_$head.md" "${V[@]}" > "$OUT/sweep_$head.log" 2>&1 &
done
wait
mps_stop
tail -25 "$OUT/sweep_c51.log"; tail -12 "$OUT/sweep_iqn.log"
