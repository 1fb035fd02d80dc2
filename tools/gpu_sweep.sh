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
G="agent.gamma=0.9"
timeout "$LIMIT" python3 tools/sweep.py --task regime --heads iqn --seeds 3 --workers "${IQN_WORKERS:-3}" \
  --jsonl "$OUT/sweep_iqn.jsonl" --md "$OUT/sweep_iqn.md" \
  --variant base --variant "gamma0.9:$G" --variant "gamma0.9-lr3e-4:$G,optim.lr=3e-4" > "$OUT/sweep_iqn.log" 2>&1 &
timeout "$LIMIT" python3 tools/sweep.py --task regime --heads c51 --seeds 3 --workers "${C51_WORKERS:-5}" \
  --jsonl "$OUT/sweep_c51.jsonl" --md "$OUT/sweep_c51.md" \
  --variant base --variant "lr3e-4:optim.lr=3e-4" --variant "gamma0.9:$G" --variant "gamma0.95:agent.gamma=0.95" \
  --variant "gamma0.9-lr3e-4:$G,optim.lr=3e-4" --variant "gamma0.9-nstep1:$G,replay.n_step=1" \
  --variant "gamma0.9-upc2:$G,agent.updates_per_collect=2" --variant "gamma0.9-h128:$G,net.hidden=[128,128]" \
  --variant "gamma0.9-atoms101:$G,net.atoms=101" --variant "gamma0.9-eps2k:$G,agent.eps_steps=2000" \
  --variant "gamma0.9-nopopart:$G,agent.popart=false" --variant "gamma0.9-b256:$G,agent.batch_size=256" \
  > "$OUT/sweep_c51.log" 2>&1
wait
echo quit | nvidia-cuda-mps-control 2>/dev/null
tail -25 "$OUT/sweep_c51.log"; tail -12 "$OUT/sweep_iqn.log"
