#!/usr/bin/env bash
# One GPU call for issue 18 (about 5-6 minutes): the on/off screen of every mechanism it wired
# (tools/mechanism_screen.py: PopArt, the C51 warm-up freeze, the plan head, spectral norm,
# shrink-and-perturb, offline double DQN against CQL from recorded behaviour runs), both heads where
# they apply, 3 seeds, the learning check's budget (10,000 updates), runs spread over worker processes
# under MPS. Each finished run is appended to $OUT/mechanisms.jsonl at once, so a call cut short keeps
# what it measured; the table is $OUT/mechanisms.md (docs/results.md's section) and $OUT/mechanisms.json.
#
#   OUT=<dir> bash tools/gpu_mechanisms.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudarl-mechanisms}; mkdir -p "$OUT"
rm -f "$OUT/mechanisms.jsonl"  # appended to run by run
export PYTHONPATH=. PYTHONFAULTHANDLER=1
. tools/mps.sh
mps_start
# 45 online runs on 10 workers beside the offline chain (3 behaviour runs, then 12 offline runs) on 4;
# 14 processes share the GPU (16 CPU cores on the host)
timeout "${SCREEN_LIMIT_S:-340}" python3 tools/mechanism_screen.py --seeds 3 --workers "${WORKERS:-14}" \
  --out "$OUT/mechanisms.json" --jsonl "$OUT/mechanisms.jsonl" --md "$OUT/mechanisms.md" \
  --recordings "$OUT/recordings" > "$OUT/mechanisms.log" 2>&1
status=$?
mps_stop
if [ ! -f "$OUT/mechanisms.md" ]; then  # cut short: the table of the runs that finished
  python3 tools/mechanism_screen.py --table-only --jsonl "$OUT/mechanisms.jsonl" --out "$OUT/mechanisms.json" \
    --md "$OUT/mechanisms.md" >> "$OUT/mechanisms.log" 2>&1
fi
rm -rf "$OUT/recordings"  # the behaviour files (hundreds of MB): not worth bringing back
tail -n 40 "$OUT/mechanisms.log"
exit $status
