# Session 20's calls, at the last-bar commit.  OUT=$OUT bash docs/bench/gpu1_s20.sh A|B <sha>
# A: gpu_check (the report).  B: compute-sanitizer on the new kernels' tests, then bench_encoders over the new
# code (with the PyTorch twin, eager and one graph) and over 8d1f246's (.gpu_base, cudarl only), same machine.
# .gpu_base was made here with `mkdir .gpu_base && git archive 8d1f246 cudarl cuda_src tools | tar -x -C .gpu_base`,
# ignored through .git/info/exclude and sent with the call's carry. (B as it ran first had bench_encoders
# without the PyTorch arms, with shorter timeouts: docs/bench/gpu-13421b4/README.md has it.)
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
if [ "$1" = A ]; then
export CUDARL_COMMIT=$2; PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-net-variants --no-dw-variants" DEADLINE_S=330 OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > $OUT/gc.log 2>&1; cp docs/gpu-report.md /tmp/gc/pytest.log $OUT/; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/gc/pytest.log | tail -12; grep -E "train step \(graph|collect step|speed-up" docs/gpu-report.md
else
K="(last_bar_scan or last_rows or last_position) and not 512 and not 4096"
F="tests/parity/test_ssm.py tests/parity/test_seq.py tests/parity/test_attention.py"
t memcheck; timeout 80 compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider $F -k "$K" 2>&1 | grep -E "ERROR SUMMARY|passed|failed" | tail -3
t racecheck; timeout 90 compute-sanitizer --tool racecheck --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider $F -k "$K" 2>&1 | grep -E "HAZARD|RACECHECK SUMMARY|passed|failed" | tail -3
t bench_new; PYTHONPATH=. timeout 170 python3 tools/bench_encoders.py --kind both --out $OUT/enc_new.json > $OUT/enc_new.log 2>&1; grep -E "step|acting|check|rel" $OUT/enc_new.log | tail -40
t bench_base; (cd .gpu_base && PYTHONPATH=. timeout 100 python3 tools/bench_encoders.py --kind both --no-torch --out $OUT/enc_base.json > $OUT/enc_base.log 2>&1; grep -E "step|acting" $OUT/enc_base.log | tail -24)
fi
t end
