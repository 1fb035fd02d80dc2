#!/usr/bin/env bash
# One GPU call for issue 17 (about 7-8 minutes): the learning check at the defaults (every task of
# tools/learning_check.py, both heads, 3 seeds, 84 runs: the results page, the targets, the deployment
# rules on and off, the real series) and, beside it under MPS, the screen of the training-side
# mechanisms (tools/sweep.py, one override each, 96 runs). Each finished run is appended to a JSON-lines
# file at once, so a call cut short keeps what it measured.
#
#   CUDARL_COMMIT=<sha> OUT=<dir> bash tools/gpu_screen.sh
#
# Writes under $OUT: learning_check.json(l), screen.jsonl, screen_level.jsonl, their .md tables,
# results.md (docs/results.md's text, with the screen's on/off table) and the logs. Rebuild the page
# from partial rows: python3 tools/learning_report.py $OUT/learning_check.jsonl --screen $OUT/screen.jsonl \
#   --screen $OUT/screen_level.jsonl --md results.md
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudarl-screen}; mkdir -p "$OUT"
rm -f "$OUT/learning_check.jsonl" "$OUT/screen.jsonl" "$OUT/screen_level.jsonl"  # appended to run by run
export PYTHONPATH=. PYTHONFAULTHANDLER=1
. tools/mps.sh
mps_start
LIMIT=${SCREEN_LIMIT_S:-450}
SEEDS=${SEEDS:-3}
# DRY=1 DEVICE=cpu SEEDS=1: the same plumbing with CPU-sized, 40-update runs (a check of the script, no result)
RUN=(--device "${DEVICE:-auto}" ${DRY:+--quick --set run.steps=40 --set run.eval_every=20})
# 10 configurations are tried in this call (base and 4 variants, 2 heads): the deflated Sharpe ratio's trials.
# Workers: 7 + 5 + 2 = 14 processes share the GPU (16 CPU cores on the host)
timeout "$LIMIT" python3 tools/learning_check.py --seeds "$SEEDS" "${RUN[@]}" --workers "${CHECK_WORKERS:-7}" --set eval.trials=10 \
  --out "$OUT/learning_check.json" --jsonl "$OUT/learning_check.jsonl" > "$OUT/learning.log" 2>&1 &
# The variants: weight decay, a cosine learning-rate decay to 0 over the budget, deploying a moving
# average of the weights (half-life 1,000 updates), on the tasks with targets; and the price-level
# features (the OU's state, which no sum of returns gives) on the OU tasks and two controls. Arrays
# passed as "${V[@]}": each word whole and unglobbed ([...] is a glob pattern).
V=(--variant "wd1:optim.weight_decay=1.0" --variant "cos:optim.schedule=cosine,optim.period=10000"
   --variant "avg:eval.average_halflife=1000")
timeout "$LIMIT" python3 tools/sweep.py --tasks regime,ou,noise,default --heads c51,iqn --seeds "$SEEDS" "${RUN[@]}" \
  --workers "${SCREEN_WORKERS:-5}" --set eval.trials=10 --jsonl "$OUT/screen.jsonl" --md "$OUT/screen.md" \
  "${V[@]}" > "$OUT/screen.log" 2>&1 &
L=(--variant "level:features.groups=[returns,log_vol,range,body,close_loc,volume,time,extra,level]")
timeout "$LIMIT" python3 tools/sweep.py --tasks ou,ou-b,regime,noise --heads c51,iqn --seeds "$SEEDS" "${RUN[@]}" \
  --workers "${LEVEL_WORKERS:-2}" --set eval.trials=10 --jsonl "$OUT/screen_level.jsonl" --md "$OUT/screen_level.md" \
  "${L[@]}" > "$OUT/screen_level.log" 2>&1 &
wait
mps_stop
S=(--screen "$OUT/screen.jsonl" --screen "$OUT/screen_level.jsonl")
python3 tools/learning_report.py "$OUT/learning_check.jsonl" "${S[@]}" --md "$OUT/results.md"
if [ -f "$OUT/learning_check.json" ]; then
  python3 tools/learning_report.py "$OUT/learning_check.json" "${S[@]}" --md "$OUT/results.md"
fi
tail -n 30 "$OUT/learning.log"; tail -n 20 "$OUT/screen.log"; tail -n 12 "$OUT/screen_level.log"
