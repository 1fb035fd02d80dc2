#!/usr/bin/env bash
# One GPU call for issue 17 (about 7-8 minutes): the learning check at the defaults (every task of
# tools/learning_check.py, both heads, 3 seeds: the results page, the targets, the deployment rules on
# and off, the real series) and, beside it under MPS, the screen of the training-side mechanisms
# (tools/sweep.py, one override each, on the tasks with targets). Each finished run is appended to a
# JSON-lines file at once, so a call cut short keeps what it measured.
#
#   CUDARL_COMMIT=<sha> OUT=<dir> bash tools/gpu_screen.sh
#
# Writes under $OUT: learning_check.json, learning_check.jsonl, screen.jsonl, screen.md, results.md
# (docs/results.md's text, with the screen's on/off table) and the two logs. Rebuild the page from
# partial rows: python3 tools/learning_report.py $OUT/learning_check.jsonl --screen $OUT/screen.jsonl --md results.md
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudarl-screen}; mkdir -p "$OUT"
rm -f "$OUT/learning_check.jsonl" "$OUT/screen.jsonl"  # both are appended to run by run
export PYTHONPATH=. PYTHONFAULTHANDLER=1
. tools/mps.sh
mps_start
LIMIT=${SCREEN_LIMIT_S:-450}
# 10 configurations are tried in this call (base and 4 variants, 2 heads): the deflated Sharpe ratio's trials
timeout "$LIMIT" python3 tools/learning_check.py --seeds 3 --workers "${CHECK_WORKERS:-7}" --set eval.trials=10 \
  --out "$OUT/learning_check.json" --jsonl "$OUT/learning_check.jsonl" > "$OUT/learning.log" 2>&1 &
# The variants: a turnover penalty in the training reward, weight decay, a cosine learning-rate decay to
# 0 over the budget, and the price-level features (the OU's state, which no sum of returns gives). An
# array passed as "${V[@]}": each word whole and unglobbed ([...] is a glob pattern).
V=(--variant "pen3:agent.train_cost_bps=3" --variant "wd1:optim.weight_decay=1.0"
   --variant "cos:optim.schedule=cosine,optim.period=10000"
   --variant "level:features.groups=[returns,log_vol,range,body,close_loc,volume,time,extra,level]")
timeout "$LIMIT" python3 tools/sweep.py --tasks regime,ou,ou-b,noise,default --heads c51,iqn --seeds 3 \
  --workers "${SCREEN_WORKERS:-7}" --set eval.trials=10 --jsonl "$OUT/screen.jsonl" --md "$OUT/screen.md" \
  "${V[@]}" > "$OUT/screen.log" 2>&1 &
wait
mps_stop
python3 tools/learning_report.py "$OUT/learning_check.jsonl" --screen "$OUT/screen.jsonl" --md "$OUT/results.md"
if [ -f "$OUT/learning_check.json" ]; then
  python3 tools/learning_report.py "$OUT/learning_check.json" --screen "$OUT/screen.jsonl" --md "$OUT/results.md"
fi
tail -n 30 "$OUT/learning.log"; tail -n 25 "$OUT/screen.log"
