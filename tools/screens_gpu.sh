#!/usr/bin/env bash
# One GPU call for issue 19's on/off screens: the seven auxiliary signals (tools/mechanism_screen.py
# --only aux) and risk-sensitive acting (tools/risk_screen.py), 3 seeds, the learning check's budget
# (10,000 updates, 4,096 environments), the two screens side by side under MPS on one GPU.
#
#   CUDARL_COMMIT=<sha> OUT=<dir> DEADLINE_S=270 bash tools/screens_gpu.sh
#
# Wall time: DEADLINE_S (default 280) plus a few seconds for the tables; MPS start-up counts inside it.
# Both screens are larger than one call (about 330 s and 790 s of a 14-process GPU at the recorded
# run times, docs/bench/learning/), so each runs in two stages within DEADLINE_S:
#   1. the reduced set, C51 on the hidden-regime market and the S&P 500 (the known-answer market and the
#      real series the issue asks for):
#      - aux: every signal (horizons, risk, denoise, horizons + vaccine, homeostatic, causal, selectivity
#        over features and over bars) and the defaults: 17 rows x 3 seeds = 51 runs;
#      - risk: act_by = mean, cvar at alpha 0.1, 0.25, 0.5, mean - 1 std: 5 x 2 tasks x 3 seeds = 30 runs;
#      expected about 215 s (the recorded per-run walls of these tasks and heads under 14 processes,
#      summed over the 81 runs, over 14) to about 275 s (the aux signals' extra step cost, up to half of
#      the step with the vaccine, and recorded calls that ran 1.2x slower than that sum); if slower, the
#      deadline drops the last runs of seed 2 (sp500 first), which a later call with AUX_FROM/RISK_FROM runs;
#   2. the rest of each full screen, started only while a run can still end before the deadline: aux on
#      IQN (regime), the canary and noise; risk with IQN, on ar and ou, cvar 0.05 and mean - 0.5 std.
# Runs start seed by seed, longest first within a seed, and none starts unless it is expected to end
# before the deadline (tools/run_plan.py), so a call ends with whole runs; what it did not reach is run
# by a later call given the earlier rows (AUX_FROM, RISK_FROM: their runs are skipped, the tables cover
# every call's rows).
#
# Writes under $OUT (5 files): aux.jsonl, risk.jsonl (one row per finished run, appended as it ends),
# aux.log, risk.log, tables.md (both on/off tables). Rebuild the tables anywhere from the rows:
#   python3 tools/mechanism_screen.py --table-only --jsonl aux.jsonl --out /tmp/aux.json --md aux.md
#   python3 tools/risk_screen.py --table-only --jsonl risk.jsonl --out /tmp/risk.json --md risk.md
# Knobs: DEADLINE_S (280), AUX_WORKERS (9) and RISK_WORKERS (5): 14 processes share the GPU, as the
# recorded calls ran (16 CPU cores); SEEDS (3). DRY=1 DEVICE=cpu: the same plumbing with CPU-sized,
# 40-update runs (with SEEDS=1, one seed; a check of the script, no result).
#
# No run loses its work when a stage's timeout cuts it: every run has a run directory under RUN_ROOT
# (default .runs/screens, inside the working tree and git-ignored, so a warm device machine keeps it between
# chained calls; aux/, risk/, and the behaviour recordings in recordings/), checkpointed after each
# validation evaluation and when timeout's SIGTERM arrives (the workers save, the screen waits for them;
# KILL_AFTER_S, default 20, is timeout's --kill-after: SIGKILL only if that takes longer, so a call may end
# up to that much after DEADLINE_S). The rows of every call on the machine are kept there too
# ($RUN_ROOT/aux.jsonl, risk.jsonl; AUX_FROM / RISK_FROM replace them): a later call with the same command
# skips the finished runs and continues the cut ones from their checkpoints. rm -rf "$RUN_ROOT" to start anew.
set -u
cd "$(dirname "$0")/.."
START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-280}
END=$((START + DEADLINE_S))
OUT=${OUT:-/tmp/cudarl-screens}; mkdir -p "$OUT"
RUN_ROOT=${RUN_ROOT:-.runs/screens}; mkdir -p "$RUN_ROOT"
TMP=$(mktemp -d)  # the JSON copies of the tables (the rows are in the JSONL files already)
for name in aux risk; do  # rows of earlier calls, if given: their runs are not repeated
  from_var=$(echo "${name}_FROM" | tr a-z A-Z)
  if [ -n "${!from_var:-}" ]; then cp "${!from_var}" "$RUN_ROOT/$name.jsonl"; fi
done
export PYTHONPATH=. PYTHONFAULTHANDLER=1
. tools/mps.sh
mps_start
SEEDS=${SEEDS:-3}
RUN=(--seeds "$SEEDS" --device "${DEVICE:-auto}" --resume ${DRY:+--quick --set run.steps=40 --set run.eval_every=20})
CORE_VARIANTS="cvar 0.1,cvar 0.25,cvar 0.5,mean-std 1"
left() { echo $((END - $(date +%s))); }  # seconds to the deadline
# each stage: no run starts unless expected to end 10 s before the deadline (tables, MPS shutdown);
# timeout is the hard stop (its SIGTERM checkpoints the runs it cuts)
stage() {
  local tool=$1 t; shift; t=$(left)
  if [ "$t" -le 20 ]; then echo "$tool: skipped, ${t} s to the deadline"; return; fi
  timeout --kill-after="${KILL_AFTER_S:-20}" "$t" python3 "tools/$tool" "${RUN[@]}" --deadline-s "$((t - 10))" "$@"
}
(
  # the recordings' paths are part of the offline runs' overrides, so they stay put between calls
  A=(--only aux --workers "${AUX_WORKERS:-9}" --jsonl "$RUN_ROOT/aux.jsonl" --out "$TMP/aux.json"
     --recordings "$RUN_ROOT/recordings" --run-root "$RUN_ROOT/aux")
  stage mechanism_screen.py "${A[@]}" --tasks regime,sp500 --heads c51
  stage mechanism_screen.py "${A[@]}"
) > "$OUT/aux.log" 2>&1 &
(
  R=(--workers "${RISK_WORKERS:-5}" --jsonl "$RUN_ROOT/risk.jsonl" --out "$TMP/risk.json" --run-root "$RUN_ROOT/risk")
  stage risk_screen.py "${R[@]}" --tasks regime,sp500 --heads c51 --only "$CORE_VARIANTS"
  stage risk_screen.py "${R[@]}"
) > "$OUT/risk.log" 2>&1 &
wait
mps_stop
for name in aux risk; do cp "$RUN_ROOT/$name.jsonl" "$OUT/$name.jsonl" 2>/dev/null || : > "$OUT/$name.jsonl"; done
WALL=$(($(date +%s) - START))
H="Issue 19's screens, commit ${CUDARL_COMMIT:-unknown}, ${SEEDS} seed(s), ${WALL} s wall (deadline ${DEADLINE_S} s)."
{
  echo "$H"; echo
  python3 tools/mechanism_screen.py --table-only --jsonl "$OUT/aux.jsonl" --out "$TMP/aux.json" --md "$TMP/aux.md" >/dev/null
  cat "$TMP/aux.md"; echo
  python3 tools/risk_screen.py --table-only --jsonl "$OUT/risk.jsonl" --out "$TMP/risk.json" --md "$TMP/risk.md" >/dev/null
  cat "$TMP/risk.md"
} > "$OUT/tables.md" 2>&1
echo "$H"
for name in aux risk; do
  python3 - "$OUT/$name.jsonl" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "tools")
import run_plan
p = Path(sys.argv[1])
rows = run_plan.read_rows(p)
bad = [r for r in rows if r.get("error")]
print(f"{p.name}: {len(rows)} runs, {len(bad)} failed, {sum(r.get('wall_s', 0) for r in rows):.0f} s of run wall")
for r in bad[:5]:
    print(f"  FAILED {r.get('variant')} {r['task']} {r['head']} seed {r['seed']}: {r['error'][:200]}")
EOF
  grep -h "not started\|Traceback\|Error" "$OUT/$name.log" | tail -n 4
done
rm -rf "$TMP"
