# Prepared for the next session (NOT RUN ON A GPU when written): one device call, from a checkout of main with the
# prepared branches merged (local branches homeo-batch, then res-epilogue on top of it; or the patches in order:
# git am docs/bench/homeo-batch.patch docs/bench/res-epilogue.patch), main's tree before them in .gpu_base
# (ignored; sent by carry):
#   rm -rf .gpu_base && mkdir .gpu_base && git archive main cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#   OUT=$OUT bash docs/bench/next_call_s26.sh
# then, chained on the warm machine, gpu_check at the merged commit (docs/bench/gpu_s25.sh G <sha>). In order of what a
# short call must not miss:
#   1. the branches' GPU tests (homeostatic; blas and the encoders where res-epilogue is merged);
#   2. bench_aux --encoder mlp --no-whole on both trees (homeo-batch: homeostatic alone +18.2 us at 87a1f0f, predicted
#      back to about +12-13 us) and bench_encoders --kind ssm / attention --no-torch on both (res-epilogue);
#   3. memcheck and racecheck on the homeostatic tests.
# RES=1 (res-epilogue merged: docs/bench/res-epilogue.patch) adds its blas and encoder tests and res_bits.py's comparison.
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( 540 - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
TESTS="tests/parity/test_homeostatic.py tests/unit/test_aux_reg.py tests/unit/test_windows.py"  # test_windows: the one-sample SSM runs (9d37812)
[ -n "${RES:-}" ] && TESTS="$TESTS tests/parity/test_blas.py tests/unit/test_residual_linear.py tests/parity/test_encoder_parity.py tests/unit/test_split_linear.py tests/parity/test_seq.py tests/unit/test_windows.py tests/unit/test_c51_iqn.py tests/unit/test_gemm_algo.py tests/unit/test_probe_cache.py tests/unit/test_policy.py"
t tests; timeout $(left 200) python3 -m pytest -m gpu -q -p no:cacheprovider $TESTS > /tmp/tests.log 2>&1; grep -E "^(FAILED|ERROR|E  )|passed|failed" /tmp/tests.log | tail -12
for tree in .gpu_base .; do
  n=new; [ "$tree" = .gpu_base ] && n=base
  t "bench_aux $n"; (cd $tree && PYTHONPATH=. timeout $(left 40) python3 tools/bench_aux.py --encoder mlp --no-whole --out $OUT/aux_$n.json > /tmp/aux_$n.log 2>&1; grep -E "aux (none|all|homeostatic) .*train step" /tmp/aux_$n.log)
  for kind in ssm attention; do
    t "bench_encoders $kind $n"; (cd $tree && PYTHONPATH=. timeout $(left 80) python3 tools/bench_encoders.py --kind $kind --no-torch --out $OUT/enc_${kind}_$n.json > /tmp/enc_${kind}_$n.log 2>&1; grep -E "step \(graph|acting" /tmp/enc_${kind}_$n.log | tail -6)
  done
done
if [ -n "${RES:-}" ]; then  # res-epilogue changes the encoders' GPU bits in the last place: how much
  t res_bits; (cd .gpu_base && PYTHONPATH=. timeout $(left 40) python3 ../docs/bench/res_bits.py /tmp/res_base.npz); PYTHONPATH=. timeout $(left 40) python3 docs/bench/res_bits.py /tmp/res_new.npz && python3 docs/bench/res_bits.py --compare /tmp/res_new.npz /tmp/res_base.npz | tail -12
fi
for tool in memcheck racecheck; do
  t $tool; timeout $(left 60) compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_homeostatic.py 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -4
done
t end
