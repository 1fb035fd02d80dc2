# Prepared for the next session (branch fwd-rowsj; not run on a GPU when written), from a checkout of fwd-rowsj
# with main's tree in .gpu_base (sent by carry):
#   mkdir .gpu_base && git archive main cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#   OUT=$OUT bash docs/bench/next_call_s24.sh
# fwd-rowsj: ssd_forward's state update on tile_gemm's C4 mapping with B as RowsJ (as the backward's dS update,
# which took ssd_backward 699 -> 591 us with its other k-major products), and gated_rmsnorm_forward's g kept in
# registers between its two passes (rows up to 256 columns). Both: the same bits (op_bits compares them).
# 1. the SSM and seq GPU tests, memcheck and racecheck on the forward scan's tests; 2. op_bits against main;
# 3. bench_encoders --kind ssm on both trees; 4. the SSM train graph's kernels under ncu. Merge what is faster
# (then gpu_check, docs/bench/gpu1_s23.sh E <sha>).
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
S="--set net.encoder=ssm --set net.window=64 --set net.d_model=128 --set net.layers=2 --set net.ssm_expand=2 --set net.ssm_state=64 --set net.ssm_headdim=64"
t tests; timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_seq.py tests/parity/test_encoder_parity.py tests/unit/test_encoders.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -8
for tool in memcheck racecheck; do
  t $tool; timeout 120 compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py -k "conv_and_scan_forward and not 512 and not 4096" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -4
done
t bits; (cd .gpu_base && PYTHONPATH=. python3 ../docs/bench/op_bits.py $OUT/bits_base.npz); PYTHONPATH=. python3 docs/bench/op_bits.py $OUT/bits_new.npz; python3 docs/bench/op_bits.py --compare $OUT/bits_base.npz $OUT/bits_new.npz > $OUT/bits.txt 2>&1; echo "compare rc=$?"; grep -v "same bits" $OUT/bits.txt; rm -f $OUT/bits_*.npz
for tree in .gpu_base .; do
  t "bench $tree"; (cd $tree && PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_$(basename $tree).json > $OUT/enc_$(basename $tree).log 2>&1; grep -E "step \(graph|acting" $OUT/enc_$(basename $tree).log | tail -6)
done
t profile; GRAPHS=train NCU_TIMEOUT=170 OUT=$OUT/prof timeout 190 bash tools/gpu_profile.sh $S > $OUT/prof.log 2>&1; grep -E "x  cudarl_(ssm|seq)|ncu_train" $OUT/prof/profile.txt | head -20
t end
