# Prepared for the next session (branch top-z; not run on a GPU when written), from a checkout of top-z with
# main's tree in .gpu_base (sent by carry):
#   mkdir .gpu_base && git archive main cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#   OUT=$OUT bash docs/bench/next_call_s24_topz.sh
# top-z: cudarl.blas takes views with row pitches (cuBLAS and cuBLASLt leading dimensions), and the top SSM
# block's in-projection (SplitLinear) computes z (its first E = 256 of 644 columns, read only by the gated norm
# at the last bar) at the last bar only: predicted (perf-notes, session 23, derived from the ncu profile) about
# 330 us off the SSM train step (three forward GEMMs, a dW and a dX of the top block) and 230 us off the
# windowed collect. Other bits than main's (other GEMM shapes): the parity tests, not op_bits, check it.
# 1. the blas, SplitLinear, encoder and SSM GPU tests; 2. bench_encoders --kind ssm on both trees (step and
# acting); 3. bench_step's SSM arms on both (train and collect steps); 4. the SSM train graph under ncu.
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
S="--set net.encoder=ssm --set net.window=64 --set net.d_model=128 --set net.layers=2 --set net.ssm_expand=2 --set net.ssm_state=64 --set net.ssm_headdim=64"
t tests; timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_blas.py tests/unit/test_split_linear.py tests/unit/test_gemm_algo.py tests/parity/test_encoder_parity.py tests/unit/test_encoders.py tests/parity/test_ssm.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -10
for tree in .gpu_base .; do
  t "bench_encoders $tree"; (cd $tree && PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_$(basename $tree).json > $OUT/enc_$(basename $tree).log 2>&1; grep -E "step \(graph|acting" $OUT/enc_$(basename $tree).log | tail -6)
done
t profile; GRAPHS=train NCU_TIMEOUT=170 OUT=$OUT/prof timeout 190 bash tools/gpu_profile.sh $S > $OUT/prof.log 2>&1; grep -E "x  |ncu_train" $OUT/prof/profile.txt | head -16
t end
