# Session 33's device calls: `LIMIT=<s> OUT=$OUT bash docs/bench/call_s33.sh <X> [sha]`.
# A: main with branch sgd-beside merged (the own SGD steps beside vaccine's grad phase, waiting on vaccine's
#    branch with SideStream.wait): the signals' GPU tests (the two trace tests that found the first form's race
#    among them), compute-sanitizer memcheck on vaccine's parity tests (its kernels now take encoder slices),
#    bench_aux on the MLP (the ablation arms).
#    Predictions (written before the call): every GPU test passes; memcheck 0 errors; all seven 156.4 ->
#    151-154 us (none about 100-102: unchanged); the vaccine arm's removal row shrinks by the 3-5 us taken off.
#    Amended before the call (no machine came for the first tries; the call now runs at bf275f8): causal's
#    grad phase folded into vaccine's kernels (dots_control_plus, apply_plus) as well: a further 3-5 us off;
#    the two together take the all-seven step's added time from 54.2 us over none (H100, 3de3b0c) to 44-48 us
#    on the same card; on an H200 (if that is what comes: none about 90-95 us there) the same 44-48 us.
#    Racecheck 0 hazards on the _plus kernels' tests.
set -f
R=$(pwd); T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-300} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = A ]; then
  t tests; PYTHONPATH=. timeout $(left 150) python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/unit/test_aux_all.py tests/unit/test_aux_branches.py tests/unit/test_aux_reg.py tests/parity/test_vaccine.py tests/unit/test_hazards.py tests/unit/test_graph.py > /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -10; cp /tmp/t.log $OUT/tests.log
  t memcheck; PYTHONPATH=. timeout $(left 90) compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/parity/test_vaccine.py > /tmp/mc.log 2>&1
  grep -E "ERROR SUMMARY|passed|failed" /tmp/mc.log | tail -3; cp /tmp/mc.log $OUT/memcheck.log
  t racecheck; PYTHONPATH=. timeout $(left 60) compute-sanitizer --tool racecheck --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/parity/test_vaccine.py -k plus > /tmp/rc.log 2>&1
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" /tmp/rc.log | tail -3; cp /tmp/rc.log $OUT/racecheck.log
  t aux; PYTHONPATH=. timeout $(left 90) python3 tools/bench_aux.py --encoder mlp --no-whole --arms ablation,vaccine,causal,denoise,risk --out $OUT/aux_mlp.json > /tmp/aux.log 2>&1
  grep -E "train step|removed" /tmp/aux.log | head -20
fi
t end
