# Session 21's first call.  OUT=$OUT bash docs/bench/gpu1_s21.sh <sha>
# 1. diag_att.py (the attention encoder's per-parameter gradient errors on the GPU against float64) over main
#    (every bar in every block) and over .gpu_att (main with 3070d5e reverted: the last-bar top block), seeds 0-2.
#    .gpu_att was made with `git archive <main + revert of 3070d5e> cudarl cuda_src tools tests docs/bench`,
#    ignored through .git/info/exclude and sent with the call's carry.
# 2. compute-sanitizer memcheck on the last-bar kernels' tests (49f4539's padding, not checked before).
# 3. gpu_check at <sha> (the report).
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
for s in 0 1 2; do
  t "diag main seed $s"; PYTHONPATH=. timeout 60 python3 docs/bench/diag_att.py tests/parity $s 2>&1 | tail -6
  t "diag lastbar seed $s"; (cd .gpu_att && PYTHONPATH=. timeout 60 python3 docs/bench/diag_att.py tests/parity $s 2>&1 | tail -6)
done
t "lastbar attention parity"; (cd .gpu_att && timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_encoder_parity.py tests/parity/test_attention.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|rel|error" | tail -8)
K="(last_bar_scan or last_rows) and not 512 and not 4096"
t memcheck; timeout 90 compute-sanitizer --tool memcheck --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_seq.py -k "$K" 2>&1 | grep -E "ERROR SUMMARY|Invalid|passed|failed" | tail -4
t gpu_check
export CUDARL_COMMIT=$1; PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-net-variants --no-dw-variants" DEADLINE_S=300 OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > $OUT/gc.log 2>&1; cp docs/gpu-report.md /tmp/gc/pytest.log $OUT/; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/gc/pytest.log | tail -12; grep -E "train step \(graph|collect step|speed-up" docs/gpu-report.md
t end
