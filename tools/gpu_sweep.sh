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
N="data.source=builtin:regime?n=200000"
timeout "$LIMIT" python3 tools/sweep.py --task regime --heads iqn --seeds 3 --workers "${IQN_WORKERS:-5}" \
  --jsonl "$OUT/sweep_iqn.jsonl" --md "$OUT/sweep_iqn.md" \
  --variant "n200k:$N" --variant "n200k-upc2:$N,agent.updates_per_collect=2" \
  --variant "steps10k:run.steps=10000" > "$OUT/sweep_iqn.log" 2>&1 &
timeout "$LIMIT" python3 tools/sweep.py --task regime --heads c51 --seeds 3 --workers "${C51_WORKERS:-6}" \
  --jsonl "$OUT/sweep_c51.jsonl" --md "$OUT/sweep_c51.md" \
  --variant "n200k:$N" --variant "n200k-upc2:$N,agent.updates_per_collect=2" \
  --variant "n200k-upc4:$N,agent.updates_per_collect=4" --variant "n200k-h128:$N,net.hidden=[128,128]" \
  --variant "steps10k:run.steps=10000" --variant "steps5k:run.steps=5000" \
  > "$OUT/sweep_c51.log" 2>&1
wait
mps_stop
tail -25 "$OUT/sweep_c51.log"; tail -12 "$OUT/sweep_iqn.log"
