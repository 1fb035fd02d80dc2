# NOT RUN: no device machine started for this script in session 36 (sixteen starts failed); the cut call
# docs/bench/call_s36c.sh ran instead (records in docs/bench/gpu-4a64988/). Kept for its predictions.
# Session 36, the one device call (issue 19, point 9), after seven starts that failed: one call, as the session's
# device time allows, holding what call_s36.sh held (its predictions stand) and the final gpu_check.
#   LIMIT=<s> OUT=$OUT bash docs/bench/call_s36b.sh <sha>     (carry .whl; needs abtrees/6252826 and
#   abtrees/9268f1b, untracked: git archive of those commits' cudarl cuda_src tools)
# Order by what the session needs most: the three-way A/B (6252826 before; 9268f1b vaccine's sums forked early;
# <sha> the apply folded into Adam's launch too), gpu_check at <sha> (every GPU test, the new parity and placement
# tests among them; the report), memcheck and racecheck on the new kernel's parity test, then the all-seven
# graph's anatomy and timeline.
# Predictions (call_s36.sh's, before the call): all seven 4-8 us under 6252826 at 9268f1b, a further 1.5-3 us
# at <sha>; none within 1.5 us across the three; gpu_check: every GPU test passes; memcheck 0 errors, racecheck
# 0 hazards; anatomy: all seven's graph 120-200 nodes, its launch 10-40 us of host time.
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-500} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
R=/tmp/r36; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader
ALL='agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine]'
ab() { local tree=$1 tag=$2; [ $(left 20) -lt 20 ] && { echo "$tag: no time"; return; }; ( cd "$tree" && PYTHONPATH=. timeout $(left 30) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all --rounds 3 --out $R/ab_$tag.json > /tmp/ab_$tag.log 2>&1 ); echo "$tag: $(grep -E "aux (none|all) +train step" /tmp/ab_$tag.log | awk '{print $3, $(NF-1)}' | tr '\n' ' ')"; }
t ab; ab abtrees/6252826 old_1; ab abtrees/9268f1b early_1; ab . fold_1; ab abtrees/6252826 old_2; ab abtrees/9268f1b early_2; ab . fold_2
t gpu_check; export CUDARL_COMMIT=$1; D=$(left ${GC_S:-260})
PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-dw-variants" DEADLINE_S=$D OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
tail -5 /tmp/gc.log; cp docs/gpu-report.md $OUT/report.md; cp /tmp/bench/bench_step.json $R/ 2>/dev/null; cp /tmp/gc/pytest.log $R/pytest.log 2>/dev/null
grep -E "^(FAILED|ERROR)" $R/pytest.log | head -10
t sanitizer; for tool in memcheck racecheck; do PYTHONPATH=. timeout $(left 60) compute-sanitizer --tool $tool --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_optim.py -k "clip_adam_soft_vaccine and 257" > $R/san_$tool.log 2>&1; echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $R/san_$tool.log | tr '\n' ' ')"; done
t anatomy; PYTHONPATH=. timeout $(left 40) python3 tools/profile_step.py --graph train --set "$ALL" --set "agent.causal_groups=[calendar,offset]" --set replay.capacity=100000 --anatomy $R/anat_all.json 2>&1 | tail -25
t timeline; python3 -m pip install -q --no-deps --target /tmp/cpt .whl/*.whl > /tmp/pip.log 2>&1 || tail -3 /tmp/pip.log
PYTHONPATH=.:/tmp/cpt timeout $(left 30) python3 tools/profile_step.py --graph train --set "$ALL" --set "agent.causal_groups=[calendar,offset]" --set replay.capacity=100000 --timeline $R/tl_all.json 2>&1 | tail -40
t end; tar czf $OUT/r36.tgz -C $R . && ls $R
