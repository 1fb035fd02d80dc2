# Session 36's device call, cut to what 494 s of device time allows after fourteen starts that failed: the
# GPU tests of vaccine's new placement and of optim.clip_adam_soft_vaccine, the three-way A/B, memcheck on the new
# kernel's parity test, the all-seven graph's anatomy; no gpu_check (docs/gpu-report.md stays at 62026c1).
#   LIMIT=<s> OUT=$OUT bash docs/bench/call_s36c.sh      (needs abtrees/6252826 and abtrees/9268f1b, untracked)
# Predictions: call_s36b.sh's (the tests pass; all seven 4-8 us under 6252826 at 9268f1b, a further 1.5-3 us at
# HEAD; none within 1.5 us; memcheck 0 errors; the graph 120-200 nodes, its launch 10-40 us of host time).
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-300} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
R=/tmp/r36; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader
ALL='agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine]'
t tests; PYTHONPATH=. timeout $(left 110) python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/parity/test_optim.py tests/unit/test_aux_branches.py tests/parity/test_vaccine.py -k "vaccine or causal" > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|^E  |passed|failed" $R/tests.log | head -14
ab() { local tree=$1 tag=$2; [ $(left 25) -lt 25 ] && { echo "$tag: no time"; return; }; ( cd "$tree" && PYTHONPATH=. timeout $(left 40) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all --rounds 2 --out $R/ab_$tag.json > /tmp/ab_$tag.log 2>&1 ); echo "$tag: $(grep -E "aux (none|all) +train step" /tmp/ab_$tag.log | awk '{print $3, $(NF-1)}' | tr '\n' ' ')"; }
t ab; ab abtrees/6252826 old_1; ab . fold_1; ab abtrees/9268f1b early_1; ab abtrees/6252826 old_2; ab . fold_2
t memcheck; PYTHONPATH=. timeout $(left 45) compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_optim.py -k "clip_adam_soft_vaccine and 257" > $R/san_memcheck.log 2>&1; echo "memcheck: $(grep -E "ERROR SUMMARY|passed|failed" $R/san_memcheck.log | tr '\n' ' ')"
t anatomy; PYTHONPATH=. timeout $(left 30) python3 tools/profile_step.py --graph train --set "$ALL" --set "agent.causal_groups=[calendar,offset]" --set replay.capacity=100000 --anatomy $R/anat_all.json 2>&1 | tail -25
t end; tar czf $OUT/r36.tgz -C $R . && ls $R
