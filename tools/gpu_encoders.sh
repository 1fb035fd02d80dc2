#!/usr/bin/env bash
# Issue 22, point 6: do the temporal encoders learn a signal that needs several bars? On builtin:lag (the
# return `lag` = 5 bars ago echoes, which no single built-in feature isolates; its references are the best
# policies on the last 5 returns: tools/learning_check.py, task `lag`, from the learn/markets branch), the
# default MLP on one bar against mlp, ssm and attention over a 64-bar window (issue 22's workload; chosen
# before any run, not tuned on this market), C51, 3 seeds, the default 10,000 updates each.
# Pass: ssm and attention reach >= 90% of the causal reference's test Sharpe; mlp measurably less.
#   CUDARL_COMMIT=<sha> OUT=<dir> bash tools/gpu_encoders.sh
#   ENCODERS="ssm" SEEDS=2 WORKERS=2 ... bash tools/gpu_encoders.sh    # some of the variants (a temporal run
#   takes about 310 s of an H200, alone or beside one other: two per call fit a call's 600 s)
# Writes $OUT/encoders_lag.jsonl (each run as it ends) and $OUT/encoders_lag.md (the summary table).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudarl-encoders}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONFAULTHANDLER=1
W="net.window=64"
declare -A SETS=([mlp]="net.encoder=mlp" [mlp-w64]="net.encoder=mlp,$W" [ssm]="net.encoder=ssm,$W"
                 [attention]="net.encoder=attention,$W")
V=()
for e in ${ENCODERS:-mlp mlp-w64 ssm attention}; do
  [[ -n "${SETS[$e]:-}" ]] || { echo "ENCODERS: unknown variant $e (known: ${!SETS[*]})" >&2; exit 2; }
  V+=(--variant "$e:${SETS[$e]}")
done
. tools/mps.sh
mps_start
timeout "${ENCODERS_LIMIT_S:-540}" python3 tools/sweep.py --tasks lag --heads "${HEADS:-c51}" --seeds "${SEEDS:-3}" \
  --workers "${WORKERS:-4}" --jsonl "$OUT/encoders_lag.jsonl" --md "$OUT/encoders_lag.md" "${V[@]}" \
  > "$OUT/encoders_lag.log" 2>&1
rc=$?
mps_stop
tail -n 30 "$OUT/encoders_lag.log"
exit $rc
