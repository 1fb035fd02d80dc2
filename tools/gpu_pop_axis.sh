#!/usr/bin/env bash
# Issue 23's agent axis on the GPU (stages 0, 2, 3, 4, 5, 5b, 6a, 6b, 6c and the per-member checkpoints: the
# "agent axis, in stages" of docs/perf-notes.md): every member-axis GPU test beside the single families' own
# files (the single path's bits), then the benches. From the repo root:
#   OUT=<dir> [PARTS="a b c d bench"] bash tools/gpu_pop_axis.sh
# PARTS: a = stages 0-3 (batched GEMMs, stacked network, optimiser), b = 4-5b (loss, PopArt, Q statistics,
# replay, collect kernels), c = 6a/6b (the learner, the joined collect step, checkpoints, Population; the
# trainer under each net.dw_gemm), d = 6c (joined members with their own settings against their Trainers
# alone, their checkpoints and resume; 6c's kernel tests are in a and b), bench (the single step and the step with net.dw_gemm = one_kernel, batched
# GEMMs, the stacked network, the joined population arm with split-K and with one-kernel dW), popbench (every
# arm of bench_population, for the ratio rows). Writes $OUT/pop_tests.txt as it goes, $OUT/junit_pop_<part>.xml
# and $OUT/bench.tar (the benches' JSON, rewritten after each bench, so a cut run keeps the finished ones).
# bench's timeouts sum to 12 minutes (each bench usually takes far less): give it a device call of its own.
OUT=${OUT:-/tmp/cudarl-pop}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE
T0=$(date +%s); L=$OUT/pop_tests.txt
t() { echo "== t=$(( $(date +%s) - T0 )) s: $1" | tee -a $L; }
B=/tmp/bench; mkdir -p $B
py() { local name=$1 lim=$2; shift 2; t "$name"; timeout $lim python3 -m pytest -q -p no:cacheprovider -m gpu \
  --junitxml=$OUT/junit_pop_$name.xml "$@" 2>&1 | grep -v '^[.sF]*\( *\[ *[0-9]*%\]\)\?$' | tail -40 >> $L; }
bn() { local name=$1 lim=$2 lines=$3; shift 3; t "$name"; timeout $lim python3 "$@" 2>&1 | tail -$lines >> $L
  tar -C $B -cf $OUT/bench.tar . ; }
for part in ${PARTS:-a b c d bench}; do case $part in
a) py a 260 tests/parity/test_blas.py tests/parity/test_nn.py tests/unit/test_stacked_network.py \
     tests/parity/test_optim_members.py tests/parity/test_optim.py ;;
b) py b 240 tests/parity/test_c51_members.py tests/parity/test_qstats_members.py tests/parity/test_popart_members.py \
     tests/parity/test_c51.py tests/parity/test_qstats.py tests/parity/test_popart.py \
     tests/parity/test_replay_members.py tests/parity/test_replay.py \
     tests/parity/test_collect_members.py tests/parity/test_agent.py tests/parity/test_env.py ;;
c) py c 360 tests/unit/test_stacked_agent.py tests/unit/test_stacked_collect.py tests/unit/test_stacked_checkpoint.py \
     tests/parity/test_state_members.py tests/unit/test_population.py tests/unit/test_population_resume.py \
     tests/parity/test_step.py \
     tests/unit/test_trainer.py::test_gpu_dw_gemm_picks_the_train_graphs_weight_gradients_and_graphed_equals_eager ;;
d) py d 360 tests/unit/test_population_settings.py ;;
bench)
  bn "bench_step (the single step with member-axis kernels; and with net.dw_gemm = one_kernel)" 180 40 \
    tools/bench_step.py --no-net-variants --dw-variants --no-encoders --no-torch --out $B/bench_step.json
  bn "bench_gemm batched" 120 40 tools/bench_gemm.py --arms batched --out $B/bench_gemm_batched.json
  bn "bench_stacked" 120 30 tools/bench_stacked.py --out $B/bench_stacked.json
  bn "bench_population, the joined arms (split-K dW, one-kernel dW)" 300 80 \
    tools/bench_population.py --arms joined,joined-onekernel --out $B/bench_population_joined.json ;;
popbench)  # every arm in one call, for the ratio rows (vmap, branches, joined; untimed as a whole)
  t "bench_population, all arms"
  timeout ${POPBENCH_S:-400} python3 tools/bench_population.py --out $B/bench_population.json 2>&1 | tail -60 >> $L ;;
esac; tar -C $B -cf $OUT/bench.tar . ; done
t end
cat $L
