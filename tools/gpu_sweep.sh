#!/usr/bin/env bash
# One GPU call's learning sweep (issue 8): C51 and IQN variants on builtin:regime, runs spread over
# worker processes; MPS is started when the machine allows it, so the processes' kernels overlap.
# Results: $OUT/sweep_c51.jsonl, $OUT/sweep_iqn.jsonl and the .md tables (partial if cut short).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONFAULTHANDLER=1
if nvidia-cuda-mps-control -d 2>/dev/null && python3 -c "import cupy; assert int(cupy.arange(4).sum()) == 6"; then
  echo "MPS: on"
else
  echo quit | nvidia-cuda-mps-control 2>/dev/null; echo "MPS: off"
fi
LIMIT=${SWEEP_LIMIT_S:-500}
L="run.steps=50000"
timeout "$LIMIT" python3 tools/sweep.py --task regime --heads iqn --seeds 3 --workers "${IQN_WORKERS:-4}" \
  --jsonl "$OUT/sweep_iqn.jsonl" --md "$OUT/sweep_iqn.md" \
  --variant "steps50k:$L" --variant "gamma0.95-steps50k:agent.gamma=0.95,$L" \
  --variant "gamma0.95:agent.gamma=0.95" --variant "lr3e-4:optim.lr=3e-4" > "$OUT/sweep_iqn.log" 2>&1 &
timeout "$LIMIT" python3 tools/sweep.py --task regime --heads c51 --seeds 3 --workers "${C51_WORKERS:-6}" \
  --jsonl "$OUT/sweep_c51.jsonl" --md "$OUT/sweep_c51.md" \
  --variant "steps50k:$L" --variant "gamma0.95-steps50k:agent.gamma=0.95,$L" --variant base \
  --variant "gamma0.9:agent.gamma=0.9" --variant "gamma0.95:agent.gamma=0.95" --variant "lr3e-4:optim.lr=3e-4" \
  --variant "nstep1:replay.n_step=1" --variant "upc2:agent.updates_per_collect=2" --variant "atoms101:net.atoms=101" \
  > "$OUT/sweep_c51.log" 2>&1
wait
echo quit | nvidia-cuda-mps-control 2>/dev/null
tail -25 "$OUT/sweep_c51.log"; tail -12 "$OUT/sweep_iqn.log"
