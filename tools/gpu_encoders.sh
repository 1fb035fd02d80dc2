#!/usr/bin/env bash
# Issue 22, point 6: do the temporal encoders learn a signal that needs several bars? On builtin:lag (the
# return `lag` = 5 bars ago echoes, which no single built-in feature isolates; its references are the best
# policies on the last 5 returns: tools/learning_check.py, task `lag`, from the learn/markets branch), the
# default MLP on one bar against mlp, ssm and attention over a 64-bar window (issue 22's workload; chosen
# before any run, not tuned on this market), C51, 3 seeds, the default 10,000 updates each.
# Pass: ssm and attention reach >= 90% of the causal reference's test Sharpe; mlp measurably less.
#   CUDARL_COMMIT=<sha> OUT=<dir> bash tools/gpu_encoders.sh
# Writes $OUT/encoders_lag.jsonl (the rows of every call, each run's as it ends) and $OUT/encoders_lag.md
# (the summary table).
#
# Larger than one device call: on an H200 at 156104e a temporal run took about 310 s two at a time
# (about 33 updates a second each; alone: not measured), the MLP runs about 70 s beside six others
# (docs/bench/learning/encoders-156104e/). Split it: ENCODERS picks the variants (default: all four),
# SEED_LIST the seeds of this call (default: 0 .. SEEDS - 1), FROM the rows of earlier calls (copied into
# $OUT/encoders_lag.jsonl; their runs are not repeated and the table covers them). For example, two calls
# of about 330 s:
#   ENCODERS="ssm attention" SEED_LIST=0 WORKERS=2 ENCODERS_LIMIT_S=540 bash tools/gpu_encoders.sh
#   ENCODERS="ssm attention" SEED_LIST=1 WORKERS=2 FROM=<first call's jsonl> bash tools/gpu_encoders.sh
# ssm-noise and attention-noise: the same encoders with agent.input_noise = NOISE (default 1.0: the
# supervised twin's ridge-like setting, docs/results.md), e.g. ENCODERS="ssm ssm-noise"; their rows are
# named with the value (ssm-noise1.0, ssm-noise2).
# GAMMA sets agent.gamma on every variant of the call and names its rows with it (ssm-noise1.0-g0.5): on
# `lag` the per-bar echo makes the best action depend on the next bar alone, and on the CPU (docs/results.md,
# fourteenth session) the windowed MLP with input noise went from 26% of the causal reference at the default
# 0.99 to 58% at 0.5 over six seeds (held-out parameters: 8% -> 34%), e.g.
# ENCODERS="ssm-noise attention-noise" GAMMA=0.5.
# CF=1 adds env.counterfactual and env.mirror (with replay.n_step = 1, which counterfactual rows need) to
# every variant and names its rows with -cfm: each step then teaches every action's reward and the mirrored
# market's; on the CPU (docs/results.md, sixteenth session) the windowed MLP with input noise and gamma 0.5
# went from 58% of the causal reference (n_step 3) to 70% over six seeds, e.g.
# ENCODERS="ssm-noise attention-noise" GAMMA=0.5 CF=1.
# STEPS sets run.steps (the updates of each run; default the GPU budget's 10,000) and names the rows with
# it (-u18000): on the CPU (docs/bench/learning/att12k-fb169ad/) attention's two lowest seeds at 12,000
# updates rose from 43% and 38% of the causal reference to 99% and 80% at 18,000, e.g. STEPS=18000.
# AVG sets eval.average_halflife (validation, test and the deployed policy use the moving average of the
# weights, Polyak averaging) and names the rows with it (-avg1000): at the GPU widths `ssm`'s validation Sharpe
# swings by 0.3-0.8 between its last evaluations (docs/results.md, twenty-fifth session), e.g. AVG=1000
# (measured in the twenty-sixth session, seeds 0-2: 64% of the causal reference against the same runs' last
# weights' 72%, each row's view "last weights": worse on every seed).
#
# No run loses its work when the time limit cuts it: every run has a run directory under RUN_ROOT (default
# .runs/encoders, inside the working tree and git-ignored, so a warm device machine keeps it between chained
# calls), checkpointed after each validation evaluation (every 1,000 updates) and when timeout's SIGTERM
# arrives (the workers save, the sweep waits for them, then exits; KILL_AFTER_S, default 30, is timeout's
# --kill-after: SIGKILL only if that takes longer). A later call on the same machine repeats the same command:
# the runs with rows are skipped, the others continue from their checkpoints (the log says from which
# update), to the rows an uncut run gives. The rows of every call on the machine are kept beside the run
# directories ($RUN_ROOT/encoders_lag.jsonl; FROM replaces them); rm -rf "$RUN_ROOT" to start anew.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cudarl-encoders}; mkdir -p "$OUT"
RUN_ROOT=${RUN_ROOT:-.runs/encoders}; mkdir -p "$RUN_ROOT"
ROWS="$RUN_ROOT/encoders_lag.jsonl"
if [ -n "${FROM:-}" ]; then cp "$FROM" "$ROWS"; fi
export PYTHONPATH=. PYTHONFAULTHANDLER=1
. tools/mps.sh
mps_start
W="net.window=64"
# every variant's shared settings (SETS) and the suffix that names its rows with them (TAG)
SETS=""; TAG=""; [ -n "${GAMMA:-}" ] && SETS=",agent.gamma=$GAMMA" && TAG="-g$GAMMA"
[ -n "${CF:-}" ] && SETS="$SETS,env.counterfactual=true,env.mirror=true,replay.n_step=1" && TAG="$TAG-cfm"
[ -n "${STEPS:-}" ] && SETS="$SETS,run.steps=$STEPS" && TAG="$TAG-u$STEPS"
[ -n "${AVG:-}" ] && SETS="$SETS,eval.average_halflife=$AVG" && TAG="$TAG-avg$AVG"
V=()
for e in ${ENCODERS:-mlp mlp-w64 ssm attention}; do
  case "$e" in
    mlp) V+=(--variant "mlp$TAG:net.encoder=mlp$SETS") ;;
    mlp-w64) V+=(--variant "mlp-w64$TAG:net.encoder=mlp,$W$SETS") ;;
    ssm|attention) V+=(--variant "$e$TAG:net.encoder=$e,$W$SETS") ;;
    ssm-noise|attention-noise)  # named with the value, so runs of two NOISE values never share rows
      V+=(--variant "$e${NOISE:-1.0}$TAG:net.encoder=${e%-noise},$W,agent.input_noise=${NOISE:-1.0}$SETS") ;;
    *) echo "ENCODERS: unknown variant $e (mlp, mlp-w64, ssm, attention, ssm-noise, attention-noise)"; exit 2 ;;
  esac
done
SEEDS_ARG=(--seeds "${SEEDS:-3}"); [ -n "${SEED_LIST:-}" ] && SEEDS_ARG=(--seed-list "$SEED_LIST")
# the limit plus KILL_AFTER_S stays under a device call's 600 s
timeout --kill-after="${KILL_AFTER_S:-30}" "${ENCODERS_LIMIT_S:-540}" python3 tools/sweep.py --tasks lag \
  --heads "${HEADS:-c51}" "${SEEDS_ARG[@]}" --workers "${WORKERS:-4}" --resume --run-root "$RUN_ROOT" \
  --jsonl "$ROWS" --md "$OUT/encoders_lag.md" "${V[@]}" > "$OUT/encoders_lag.log" 2>&1
rc=$?
mps_stop
cp "$ROWS" "$OUT/encoders_lag.jsonl" 2>/dev/null
grep -v '^  ' "$OUT/encoders_lag.log" | tail -n 30
exit $rc
