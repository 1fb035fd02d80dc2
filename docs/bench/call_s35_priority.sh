# Prepared in session 35 for its second device call: agent.aux_priority (causal's and denoise's branches at
# CUDA's least stream priority, the step's at its greatest; graphs instantiated with node priorities).
#   LIMIT=<s> OUT=$OUT bash docs/bench/call_s35_priority.sh [<sha>: then gpu_check at it, last]
# Needs abtrees/62026c1 (git archive of the commit before the change; untracked, removed after) and .whl
# (carry=[".whl"]) for the timeline.
# Why: the first call's CUPTI timeline of the all-seven MLP step (docs/bench/gpu-62026c1/) shows the step's own
# backward GEMMs at 2.3x their time without the signals (a dx GEMM 23.4 us against 10.1) while causal's and
# denoise's GEMMs run beside them: the step's chain shares the SMs with work nothing waits for until the
# backward ends. Priorities let the step's blocks be placed first.
# Predictions (session 35, before the call):
#  - the GPU tests pass (test_graph.py's, test_aux_branches.py's, the new one: least/greatest priorities on
#    the streams, the graph instantiated with node priorities, same/low trained to the same bits);
#  - bench_aux --arms all --rounds 5: "same" within 2 us of the commit before (62026c1) for all seven and
#    within 1 us for none (the driver's instantiation changes no node); "low" 5-12 us under "same" for all
#    seven (about 134-141 us against about 145 on an H100), none unchanged;
#  - the timeline with "low": the step's backward GEMMs nearer their time without the signals;
#  - gpu_check (the fourth try adds it, with low the default): every GPU test passes.
# The first two tries (16cdd81, 8865401) ran on a machine: CuPy binds no deviceGetStreamPriorityRange, and then
# the trainer's own graph stream was at the default (least) priority, under every side stream (all seven
# 150.4-152.5 us against 143.7-145.8 at 62026c1: inverted priorities cost 5-7 us). Added for the third: lowall
# (every signal's streams background); prediction: within 2 us of low (homeostatic's and vaccine's nodes on
# the chain then wait behind the step's own blocks, which they follow anyway).
# As it ran (d45b756): the final tarball step hit `set -f` (no glob) and failed, and the lowall arm needs
# abtrees/bench_variant.py, an untracked helper deleted after the call (it set the named signals' class
# attribute `background` to True, then ran tools/bench_aux.py); agent.aux_priority itself is reverted
# (docs/bench/aux-priority.patch), so the script is a record, not a rerunnable call.
set -f
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-500} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t tests; PYTHONPATH=. timeout $(left 150) python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/unit/test_graph.py tests/unit/test_aux_branches.py > /tmp/t.log 2>&1
grep -E "^(FAILED|ERROR)|^E |passed|failed" /tmp/t.log | head -12; cp /tmp/t.log $OUT/tests.log
ab() { local tree=$1 tag=$2; shift 2; [ $(left 30) -lt 30 ] && { echo "$tag: no time"; return; }; ( cd "$tree" && PYTHONPATH=. timeout $(left 50) python3 "$@" --encoder mlp --no-whole --arms all --rounds 5 --out $OUT/ab_$tag.json > /tmp/ab_$tag.log 2>&1 ); echo "$tag: $(grep -E "aux (none|all) +train step" /tmp/ab_$tag.log | awk '{print $3, $(NF-1)}' | tr '\n' ' ')"; tail -3 /tmp/ab_$tag.log | grep -i error; }
# lowall: every signal's own streams background (abtrees/bench_variant.py, untracked: the class attribute set
# before the run), the extra heads' forward branch (the network's) still urgent
V="abtrees/bench_variant.py horizons,risk,denoise,homeostatic,causal,selectivity,vaccine"
t ab; for r in 1 2; do ab abtrees/62026c1 old_$r tools/bench_aux.py; ab . same_$r tools/bench_aux.py --aux-priority same; ab . low_$r tools/bench_aux.py --aux-priority low; ab . lowall_$r $V --aux-priority low; done
t timeline; set +f; timeout 30 python3 -m pip install -q --no-deps --target /tmp/cpt .whl/*.whl > /tmp/pip.log 2>&1; set -f; tail -1 /tmp/pip.log
ALL7="agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine]"
PYTHONPATH=.:/tmp/cpt timeout $(left 50) python3 tools/profile_step.py --graph train --timeline $OUT/timeline_low.json --set "$ALL7" --set "agent.causal_groups=[calendar,offset]" --set replay.capacity=100000 --set agent.aux_priority=low > $OUT/tl_low.log 2>&1; head -2 $OUT/tl_low.log; tail -24 $OUT/tl_low.log
# gpu_check at <sha> ($1): every GPU test under the node priorities (agent.aux_priority's default low)
if [ -n "$1" ]; then
  t gpu_check; export CUDARL_COMMIT=$1
  PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-dw-variants" DEADLINE_S=$(( $(left 600) - 10 )) OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
  cp docs/gpu-report.md $OUT/report.log; cp /tmp/bench/bench_step.json $OUT/ 2>/dev/null; cp /tmp/gc/pytest.log $OUT/pytest.log 2>/dev/null
  grep -E "passed|failed" /tmp/gc/pytest.log | tail -6; grep -hE "^(FAILED|ERROR)" /tmp/gc/pytest.log | head -20
fi
# one file back (a call returns at most 8)
( cd $OUT && tar czf s35_priority.tgz *.json *.log && rm -f *.json *.log ); ls $OUT
t end
