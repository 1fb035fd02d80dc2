# Session 32, a call on branch sgd-beside (e058b9a, checked out detached in the working tree; not merged):
# bench_aux on the MLP (ablation) and the signals GPU tests. Prediction (written before the call, in the
# branch commit): all seven -3 to -5 us against main at 3de3b0c (156.4 us on an H100).
R=$(pwd); T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-180} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t aux; PYTHONPATH=. timeout $(left 60) python3 tools/bench_aux.py --encoder mlp --no-whole --arms ablation,vaccine,denoise,risk --out $OUT/aux_mlp.json > /tmp/aux.log 2>&1
grep -E "train step|removed" /tmp/aux.log | head -20
t tests; PYTHONPATH=. timeout $(left 100) python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/unit/test_aux_all.py tests/unit/test_aux_branches.py tests/unit/test_aux_reg.py tests/parity/test_vaccine.py > /tmp/t.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -10; cp /tmp/t.log $OUT/tests.log
t end
