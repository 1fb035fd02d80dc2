# Session 20's call: gpu_check at the last-bar commit, then compute-sanitizer on the new kernels' tests, then
# bench_encoders over the new code and over 8d1f246's (.gpu_base), same machine.  OUT=$OUT bash ... <sha>
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
export CUDARL_COMMIT=$1; PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-net-variants --no-dw-variants" DEADLINE_S=250 OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > $OUT/gc.log 2>&1; cp docs/gpu-report.md $OUT/; cp /tmp/gc/pytest.log $OUT/ 2>/dev/null; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/gc/pytest.log | tail -12; grep -E "train step \(graph|collect step" docs/gpu-report.md
K="(last_bar_scan or last_rows or last_position) and not 512 and not 4096"
F="tests/parity/test_ssm.py tests/parity/test_seq.py tests/parity/test_attention.py"
t memcheck; timeout 75 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider $F -k "$K" 2>&1 | grep -E "ERROR SUMMARY|passed|failed" | tail -3
t racecheck; timeout 90 compute-sanitizer --tool racecheck --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider $F -k "$K" 2>&1 | grep -E "HAZARD|RACECHECK SUMMARY|passed|failed" | tail -3
t bench_new; PYTHONPATH=. timeout 70 python3 tools/bench_encoders.py --kind both --no-torch --out $OUT/enc_new.json 2>&1 | grep -E "step|acting" | tail -24
t bench_base; (cd .gpu_base && PYTHONPATH=. timeout 70 python3 tools/bench_encoders.py --kind both --no-torch --out $OUT/enc_base.json 2>&1 | grep -E "step|acting" | tail -24)
t end
