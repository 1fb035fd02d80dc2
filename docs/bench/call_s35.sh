# Prepared in session 35 for its first device call (main at the session's start, 6e569f7):
#   LIMIT=<s> OUT=$OUT bash docs/bench/call_s35.sh <sha>
# Needs the A/B's trees made here before the call (untracked; removed after):
#   for c in d643c05 7b8ec24; do mkdir -p abtrees/$c && git archive $c cudarl cuda_src tools pyproject.toml \
#     setup.cfg README.md LICENSE | tar -x -C abtrees/$c; done
# and carries the cupti-python wheels (cupti-python 13.4.0, cuda-bindings 13.5.0, cuda-pathfinder, pyelftools for
# CPython 3.12, `pip download --no-deps`) in .whl: run(..., carry=[".whl"]).
# Order: vaccine's two trace tests (one failed at e020b55 on an assertion 749c754 made wrong, mended in b67f8f5);
# the replay's own timeline of the all-seven MLP step and of none (tools/profile_step.py --timeline, CUPTI's
# concurrent-kernel records, never run before) and their comparison; gpu_check at <sha> (the report was at
# e020b55); then, as time allows, a same-machine A/B of d643c05 (vc-fused and parity-floor merged), 7b8ec24 (+
# causal's three nodes off its branch) and HEAD (+ vaccine's copy off the chain), interleaved.
# Predictions (session 35, before the call):
#  - both trace tests pass; gpu_check: every GPU test passes (2,254 or so), 0 failed;
#  - timelines: the all-seven replay's span 148-160 us (bench_aux measured 148.1 on an H100; recording adds a
#    little), none's 100-106 us; the comparison shows the step's own kernels (the ones in both graphs) longer in
#    all-seven by 10-20 us summed over the replay (the SM/L2-sharing reading) rather than their gaps;
#  - the A/B: the three trees' all-seven steps within 3 us of each other, none within 1 us.
# As it ran (62026c1): `set -f` below kept `.whl/*.whl` from expanding, so the wheels did not install and the
# two timelines failed; they ran in a call of their own on the same machine. A rerun needs `set +f` around pip.
set -f
R=$(pwd); T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-500} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t tests; PYTHONPATH=. timeout $(left 60) python3 -m pytest -m gpu -q -p no:cacheprovider tests/unit/test_aux_branches.py -k "vaccines_backward_runs_beside or vaccines_copy" > /tmp/t.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -5; cp /tmp/t.log $OUT/tests.log
t cupti; timeout 30 python3 -m pip install -q --no-deps --target /tmp/cpt .whl/*.whl > /tmp/pip.log 2>&1; tail -2 /tmp/pip.log
ALL7="agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine]"
PYTHONPATH=.:/tmp/cpt timeout $(left 50) python3 tools/profile_step.py --graph train --timeline $OUT/timeline_all.json --set "$ALL7" --set "agent.causal_groups=[calendar,offset]" --set replay.capacity=100000 > /tmp/tl_all.log 2>&1; head -4 /tmp/tl_all.log; tail -4 /tmp/tl_all.log; cp /tmp/tl_all.log $OUT/
PYTHONPATH=.:/tmp/cpt timeout $(left 40) python3 tools/profile_step.py --graph train --timeline $OUT/timeline_none.json --set replay.capacity=100000 > /tmp/tl_none.log 2>&1; head -3 /tmp/tl_none.log; tail -2 /tmp/tl_none.log; cp /tmp/tl_none.log $OUT/
PYTHONPATH=. timeout 20 python3 tools/profile_step.py --compare $OUT/timeline_none.json $OUT/timeline_all.json --out $OUT/timeline_compare.json > /tmp/cmp.log 2>&1; head -12 /tmp/cmp.log; cp /tmp/cmp.log $OUT/
t gpu_check; export CUDARL_COMMIT=$1; D=$(( ${GC_S:-280} ))
PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-dw-variants" DEADLINE_S=$D OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
cp docs/gpu-report.md $OUT/report.md; cp /tmp/bench/bench_step.json $OUT/ 2>/dev/null; cp /tmp/gc/pytest.log $OUT/pytest.log 2>/dev/null
grep -E "passed|failed" /tmp/gc/pytest.log | tail -4; grep -hE "^(FAILED|ERROR)" /tmp/gc/pytest.log | head -20
ab() { local tree=$1 tag=$2; [ $(left 30) -lt 30 ] && { echo "$tag: no time"; return; }; ( cd "$tree" && PYTHONPATH=. timeout $(left 45) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all --rounds 5 --out $OUT/ab_$tag.json > /tmp/ab_$tag.log 2>&1 ); echo "$tag: $(grep -E "aux (none|all) +train step" /tmp/ab_$tag.log | awk '{print $3, $(NF-1)}' | tr '\n' ' ')"; }
t ab; ab abtrees/d643c05 d643c05_1; ab . head_1; ab abtrees/7b8ec24 7b8ec24_1; ab abtrees/d643c05 d643c05_2; ab . head_2; ab abtrees/7b8ec24 7b8ec24_2
t end
