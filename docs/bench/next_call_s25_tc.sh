# Prepared for the next session (branch scan-tc; NOT RUN ON A GPU when written): one device call, from a checkout of
# scan-tc with main's tree in .gpu_base (sent by carry):
#   mkdir .gpu_base && git archive main cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#   OUT=$OUT bash docs/bench/next_call_s25_tc.sh
# scan-tc: under net.tf32 the SSM chunked scan and its backward run their matrix products on TF32 tensor cores
# (cudarl_ssm_ssd_forward_tc / ssd_backward_tc, mma.sync m16n8k8); the FP32 kernels are unchanged (the same
# machine code: tools/compare_kernels.py s24). In order of what a short call must not miss:
#   1. the _tc GPU tests (against the float64 twin at 4 * 2^-11, graphed == eager, the tf32 encoder);
#   2. bench_encoders --kind ssm --no-torch on scan-tc and on s24: its "tf32" rows are the gain (s24's tf32 arm
#      runs the FP32 scans), its "fp32" rows must not move;
#   3. compute-sanitizer memcheck and racecheck on the _tc tests' small cases;
#   4. the existing SSM and encoder GPU tests, with what is left of the 395 s.
# Each step under timeout; the whole under 400 s. Predicted (the branch's report): ssd_forward_tc about 140 us
# (ssd_forward 222), ssd_backward_tc about 440 (591), the TF32 encoder step 3.66 -> about 3.3 ms.
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( 395 - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }  # min(step, what is left)
nvidia-smi --query-gpu=name --format=csv,noheader
K_TC="tc_scans or tf32 or True"  # the _tc op tests and the tf32 encoder tests ([ssm-True] of the graphed one)
t "tc tests"; timeout $(left 110) python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_encoder_parity.py -k "$K_TC" > $OUT/tc_tests.log 2>&1; grep -E "^(FAILED|ERROR|E  )|passed|failed" $OUT/tc_tests.log | tail -12
for tree in . .gpu_base; do
  n=scan-tc; [ "$tree" = .gpu_base ] && n=s24
  t "bench $n"; (cd $tree && PYTHONPATH=. timeout $(left 75) python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_$n.json > $OUT/enc_$n.log 2>&1; grep -E "step \(graph|phase|acting" $OUT/enc_$n.log | tail -12)
done
for tool in memcheck racecheck; do
  t $tool; timeout $(left 45) compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py -k "tc_scans and not 512 and not 7-64 and not 5-64" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -4
done
t "existing tests"; timeout $(left 200) python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_encoder_parity.py -k "not ($K_TC)" > $OUT/fp32_tests.log 2>&1; echo "rc=$? (124: out of time)"; grep -E "^(FAILED|ERROR|E  )|passed|failed" $OUT/fp32_tests.log | tail -8
t end
