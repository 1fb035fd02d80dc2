# Session 23's GPU calls after the first two (next_call_s23.sh on gemm-probe, next_call_s23_scan.sh on scan-vec).
#   A: the backward's 16-byte rows (a215948) against main before it (765a20e, in .gpu_base by carry):
#      mkdir .gpu_base && git archive 765a20e cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#      OUT=$OUT bash docs/bench/gpu1_s23.sh A
#      the SSM GPU tests, memcheck and racecheck on the scans' small cases, bench_encoders on both trees, and
#      the SSM train graph's kernels under ncu at issue 22's workload.
#   B: conv_forward in segments of 16 bars against a215948 (.gpu_base = git archive a215948 ...): tests, memcheck,
#      its bits against the old kernel's (docs/bench/op_bits.py), bench_encoders on both, the profile again.
#   C: bias_act_backward's tall chunks against 238e9dd: tests, bits, bench_encoders (both encoders) on both, and
#      the SSM train and collect graphs' kernels under ncu.
#   D: ssd_backward's RowsJ (C4) products and gated_rmsnorm_backward's zero rows against 76e1a80: tests, memcheck
#      and racecheck, the scans' bits against 76e1a80's (op_bits), bench_encoders ssm on both, the profile.
#   E: OUT=$OUT bash docs/bench/gpu1_s23.sh E <sha>: gpu_check at <sha> (the report of record).
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
S="--set net.encoder=ssm --set net.window=64 --set net.d_model=128 --set net.layers=2 --set net.ssm_expand=2 --set net.ssm_state=64 --set net.ssm_headdim=64"
if [ "$1" = A ]; then
t tests; timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_encoder_parity.py tests/unit/test_encoders.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -8
for tool in memcheck racecheck; do
  t $tool; timeout 120 compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py -k "conv_and_scan and not 512 and not 4096" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -4
done
for tree in .gpu_base .; do
  t "bench $tree"; (cd $tree && PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_$(basename $tree).json > $OUT/enc_$(basename $tree).log 2>&1; grep -E "step \(graph" $OUT/enc_$(basename $tree).log | tail -2)
done
t profile; GRAPHS=train NCU_TIMEOUT=170 OUT=$OUT/prof timeout 190 bash tools/gpu_profile.sh $S > $OUT/prof.log 2>&1; grep -E "ncu_train|ssd_|conv_" $OUT/prof/profile.txt | head -30
elif [ "$1" = B ]; then  # conv_forward in segments against a215948 (in .gpu_base by carry)
t tests; timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_encoder_parity.py tests/unit/test_encoders.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -8
t memcheck; timeout 120 compute-sanitizer --tool memcheck --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py -k "conv_and_scan and not 512 and not 4096" 2>&1 | grep -E "ERROR SUMMARY|Invalid|passed|failed" | tail -4
t bits; (cd .gpu_base && PYTHONPATH=. python3 ../docs/bench/op_bits.py $OUT/conv_base.npz); PYTHONPATH=. python3 docs/bench/op_bits.py $OUT/conv_new.npz; python3 docs/bench/op_bits.py --compare $OUT/conv_base.npz $OUT/conv_new.npz
for tree in .gpu_base .; do
  t "bench $tree"; (cd $tree && PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_$(basename $tree).json > $OUT/enc_$(basename $tree).log 2>&1; grep -E "step \(graph|acting" $OUT/enc_$(basename $tree).log | tail -6)
done
t profile; GRAPHS=train NCU_TIMEOUT=170 OUT=$OUT/prof timeout 190 bash tools/gpu_profile.sh $S > $OUT/prof.log 2>&1; grep -E "x  cudarl_ssm|ncu_train" $OUT/prof/profile.txt | head -12
elif [ "$1" = C ]; then  # bias_act_backward's tall chunks against 238e9dd (in .gpu_base by carry)
t tests; timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_nn.py tests/parity/test_ssm.py tests/unit/test_encoders.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -8
t bits; (cd .gpu_base && PYTHONPATH=. python3 ../docs/bench/op_bits.py $OUT/bits_base.npz); PYTHONPATH=. python3 docs/bench/op_bits.py $OUT/bits_new.npz; python3 docs/bench/op_bits.py --compare $OUT/bits_base.npz $OUT/bits_new.npz; rm -f $OUT/bits_*.npz
for tree in .gpu_base .; do
  t "bench $tree"; (cd $tree && PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --no-torch --out $OUT/enc_$(basename $tree).json > $OUT/enc_$(basename $tree).log 2>&1; grep -E "step \(graph|acting" $OUT/enc_$(basename $tree).log | tail -12)
done
t profile; GRAPHS="train collect" NCU_TIMEOUT=170 OUT=$OUT/prof timeout 380 bash tools/gpu_profile.sh $S > $OUT/prof.log 2>&1; grep -E "x  |ncu_" $OUT/prof/profile.txt | head -60
elif [ "$1" = D ]; then  # ssd_backward's RowsJ products and the gated norm's zero rows against 76e1a80 (.gpu_base)
t tests; timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_seq.py tests/parity/test_encoder_parity.py tests/unit/test_encoders.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -8
for tool in memcheck racecheck; do
  t $tool; timeout 120 compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py -k "conv_and_scan_backward and not 512 and not 4096" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -4
done
t bits; (cd .gpu_base && PYTHONPATH=. python3 ../docs/bench/op_bits.py $OUT/bits_base.npz); PYTHONPATH=. python3 docs/bench/op_bits.py $OUT/bits_new.npz; python3 docs/bench/op_bits.py --compare $OUT/bits_base.npz $OUT/bits_new.npz 2>&1 | grep -v "same bits"; echo "bits rc=$?"; rm -f $OUT/bits_*.npz
for tree in .gpu_base .; do
  t "bench $tree"; (cd $tree && PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_$(basename $tree).json > $OUT/enc_$(basename $tree).log 2>&1; grep -E "step \(graph" $OUT/enc_$(basename $tree).log | tail -2)
done
t profile; GRAPHS=train NCU_TIMEOUT=170 OUT=$OUT/prof timeout 190 bash tools/gpu_profile.sh $S > $OUT/prof.log 2>&1; grep -E "x  cudarl_(ssm|seq)|ncu_train" $OUT/prof/profile.txt | head -20
elif [ "$1" = E ]; then  # gpu_check at $2 (the session's last GPU-path commit), the report copied out
t gpu_check; export CUDARL_COMMIT=$2; PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-net-variants --no-dw-variants" DEADLINE_S=330 OUT=$OUT/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > $OUT/gc.log 2>&1
cp docs/gpu-report.md $OUT/; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gc/pytest.log | tail -12; grep -E "train step \(graph|collect step|speed-up" docs/gpu-report.md | head -24
fi
t end
