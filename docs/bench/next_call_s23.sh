# Prepared for the next session's first GPU call (branch gemm-probe; its GPU tests passed at 881117b, 114, H100):
#   OUT=$OUT bash docs/bench/next_call_s23.sh
# 1. The whole train and collect steps under net.gemm_algo = probe against heuristic, same machine: the MLP
#    reference step (net variants) and the ssm and attention encoder arms (bench_encoders measured the windowed
#    acting GEMMs ~4% faster under probe, the encoder step 1.001x). Merge if the collect steps gain and no arm
#    loses beyond noise; then gpu_check at the merge.
# 2. The encoders' constructors now default to net.gemm (cuBLASLt, the agent's path) where they defaulted to
#    cublas: the encoder GPU tests (Standalone encoders) run the agent's GEMMs; run them here first.
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t tests; timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/unit/test_gemm_algo.py tests/parity/test_encoder_parity.py \
  tests/unit/test_encoders.py tests/parity/test_ssm.py tests/parity/test_attention.py 2>&1 | grep -E "^E  |^FAILED|passed|failed" | tail -8
t bench_step; PYTHONPATH=. timeout 400 python3 tools/bench_step.py --no-epoch --no-torch --no-dw-variants --gemm-algo-arms --out $OUT/bench_step_probe.json > $OUT/bench_step_probe.log 2>&1
grep -E "train step \(graph|collect step" $OUT/bench_step_probe.log | tail -24
t end
