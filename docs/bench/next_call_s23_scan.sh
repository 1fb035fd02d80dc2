# Prepared for the next session (branches scan-index and scan-vec, not run on a GPU when written), from a checkout of
# scan-vec, with two ignored trees sent by carry:
#   mkdir .gpu_base .gpu_si && git archive main cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#   git archive scan-index cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_si
#   OUT=$OUT bash docs/bench/next_call_s23_scan.sh
# scan-index: the scans' loaders step (row, column) without a division (RowCol). scan-vec (on top): ssd_forward's
# B, C and S rows are N + 4 floats where N and Q P are multiples of 4, and its C B^T and C S^T products read them
# 16 bytes a load (RowsK/ColsK), the multiply-adds in the same order. Both: the same bits. 1. the SSM GPU tests
# here, memcheck on the forward's tests; 2. bench_encoders --kind ssm --no-torch over main, scan-index and here,
# same machine. Merge what is faster (then gpu_check).
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t tests; timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_encoder_parity.py tests/unit/test_encoders.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -8
t memcheck; timeout 120 compute-sanitizer --tool memcheck --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py -k "conv_and_scan and not 512 and not 4096" 2>&1 | grep -E "ERROR SUMMARY|Invalid|passed|failed" | tail -4
for tree in .gpu_base .gpu_si .; do
  t "bench $tree"; (cd $tree && PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_$(basename $tree).json > $OUT/enc_$(basename $tree).log 2>&1; grep -E "step \(graph" $OUT/enc_$(basename $tree).log | tail -2)
done
t end
