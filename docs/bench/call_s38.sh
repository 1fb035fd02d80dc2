# Session 38's first device call (written for session 37, whose device calls never started; that copy, call_s37.sh, is folded into this one): LIMIT=560 OUT=$OUT bash docs/bench/call_s38.sh <sha>.
# Written for session 37's first device call: the report at main's GPU code (784fb49's: the last commits changed no kernel),
# issue 19's point 9 again on whatever card comes (an H200 would settle the issue's stated card), and the
# all-seven step's timeline (CUPTI) to see which chain now holds its tail.
#   LIMIT=<s> OUT=$OUT bash docs/bench/call_s38.sh <sha>      (carry .whl for the timeline)
# Predictions (written before the call):
# - gpu_check: every GPU test passes (2,254 passed at 62026c1; more since: the fold's parity and placement tests);
#   bench_step's train step 95-102 us on an H100 (89-95 on an H200), collect 74-79 (H100); bench_population's joined
#   P = 64 with probed algorithms 1,650-1,900 us FP32 (1,689 on an H200 at 4418de6), above issue 23's 1,200;
#   bench_startup (added in session 37, before any call): start to first update 1.5-2.2 s warm, 4-5.5 s cold
#   (1.80 / 4.48 at the twenty-seventh session's commit);
# - bench_aux, all seven over none, 2 rounds: +34% to +39% on an H100 (36.4-36.9% at 4a64988); on an H200
#   +33% to +40% (its none is ~5% shorter, its branches as long), i.e. issue 19's 40% met there too;
# - bench_encoders (added in session 38 with the whole-step check against the PyTorch twin, issue 22 point 5):
#   the check's rows at the full workload within their bars (loss <= 1e-5, priorities and gradients <= 1e-4 rel.;
#   at the CPU's tiny shapes 1e-7 to 1e-6); the SSM encoder step 4.0-4.3 ms FP32, attention 3.6-3.8 ms (H100);
# - ncu detail of the reference step's chain kernels (Adam's one launch, the loss, the sample, the bias sums):
#   a reading, no prediction; the timeline: from the gather to the publish 135-145 us (all seven), 95-100 (none); Adam follows the step's
#   backward within 2 us (vaccine's sums done beside it), and the tail is the step's own backward (its dx GEMMs
#   slowed by the branches beside them), not a signal's chain.
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-560} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
R=/tmp/r38; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader
ALL='agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine]'
t gpu_check; export CUDARL_COMMIT=$1
PARALLEL=6 BENCHES="tools/bench_step.py tools/bench_startup.py tools/bench_population.py" BENCH_ARGS="--no-epoch --no-dw-variants" BENCH_ARGS_bench_startup="--device gpu" BENCH_ARGS_bench_population="--sizes 64 --arms joined-probe,vmap" DEADLINE_S=$(left 380) OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
tail -6 /tmp/gc.log; cp docs/gpu-report.md $OUT/report.md; cp /tmp/bench/bench_step.json /tmp/bench/bench_startup.json /tmp/bench/bench_population.json $R/ 2>/dev/null; cp /tmp/gc/pytest.log $R/pytest.log 2>/dev/null
grep -E "^(FAILED|ERROR)" $R/pytest.log | head -10
t aux; PYTHONPATH=. timeout $(left 150) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all --rounds 2 --out $R/aux_mlp.json > $R/aux.log 2>&1; grep -E "aux (none|all) +train step|share|round" $R/aux.log | tail -8
t encoders; PYTHONPATH=. timeout $(left 150) python3 tools/bench_encoders.py --out $R/bench_encoders.json > $R/enc.log 2>&1; grep -E "rel. diff|encoder step|acting" $R/enc.log | head -30
t ncu_detail; GRAPHS=train NCU_TIMEOUT=$(left 110) NCU_DETAIL='clip_adam_soft|targets_loss|sample_search|bias_act_backward' OUT=$R/prof timeout $(left 130) bash tools/gpu_profile.sh > $R/prof.log 2>&1; tail -30 $R/prof/profile.txt 2>/dev/null; grep -E "Duration|Achieved Occupancy|Registers Per|One or More Eligible|Stall" $R/prof/ncu_detail.txt 2>/dev/null | head -40
t timeline; [ $(left 40) -ge 40 ] && { python3 -m pip install -q --no-deps --target /tmp/cpt .whl/*.whl > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
PYTHONPATH=.:/tmp/cpt timeout $(left 40) python3 tools/profile_step.py --graph train --set "$ALL" --set "agent.causal_groups=[calendar,offset]" --set replay.capacity=100000 --timeline $R/tl_all.json > $R/tl_all.log 2>&1; tail -40 $R/tl_all.log; }
t end; tar czf $OUT/r38.tgz -C $R . && ls $R
