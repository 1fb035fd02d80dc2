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
# Sweep 4 (the parameters issue 8 names that sweeps 1-3 did not reach), at the 10k-update default.
timeout "$LIMIT" python3 tools/sweep.py --task regime --heads iqn --seeds 3 --workers "${IQN_WORKERS:-5}" \
  --jsonl "$OUT/sweep_iqn.jsonl" --md "$OUT/sweep_iqn.md" \
  --variant base --variant "b256:agent.batch_size=256" --variant "h128:net.hidden=[128,128]" \
  --variant "nopopart:agent.popart=false" --variant "upc2:agent.updates_per_collect=2" > "$OUT/sweep_iqn.log" 2>&1 &
timeout "$LIMIT" python3 tools/sweep.py --task regime --heads c51 --seeds 3 --workers "${C51_WORKERS:-6}" \
  --jsonl "$OUT/sweep_c51.jsonl" --md "$OUT/sweep_c51.md" \
  --variant base --variant "b256:agent.batch_size=256" --variant "b1024:agent.batch_size=1024" \
  --variant "h128:net.hidden=[128,128]" --variant "h512:net.hidden=[512,512]" \
  --variant "eps2k:agent.eps_steps=2000" --variant "eps20k:agent.eps_steps=20000" \
  --variant "nopopart:agent.popart=false" --variant "upc2:agent.updates_per_collect=2" \
  > "$OUT/sweep_c51.log" 2>&1
wait
mps_stop
tail -25 "$OUT/sweep_c51.log"; tail -12 "$OUT/sweep_iqn.log"
