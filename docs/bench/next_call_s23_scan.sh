# Prepared for the next session (branch scan-index, not run on a GPU when written):
#   mkdir .gpu_base && git archive main cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base   (carry it)
#   OUT=$OUT bash docs/bench/next_call_s23_scan.sh
# The SSM scans' loaders walk (row, column) without a division a step (RowCol): the same elements in the
# same order, so the same bits. 1. the SSM GPU tests; 2. bench_encoders --kind ssm --no-torch here and over
# main's tree, same machine (merge if not slower; the scans are about 1.6 ms of the SSM step).
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t tests; timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_encoder_parity.py tests/unit/test_encoders.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -8
t bench_new; PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_scan.json > $OUT/enc_scan.log 2>&1; grep -E "step \(graph|acting" $OUT/enc_scan.log | tail -6
t bench_base; (cd .gpu_base && PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_base.json > $OUT/enc_base.log 2>&1; grep -E "step \(graph|acting" $OUT/enc_base.log | tail -6)
t end
