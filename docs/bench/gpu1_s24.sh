# Session 24's GPU calls.
#   A: OUT=$OUT bash docs/bench/gpu1_s24.sh A <sha>, from a checkout of s24 (main + fwd-rowsj + top-z), with
#      main's tree (3bd1655) in .gpu_base and fwd-rowsj's in .gpu_si (sent by carry):
#        git archive 3bd1655 cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base   (fwd-rowsj: .gpu_si)
#      gpu_check at <sha> (every GPU test; bench_step: the report of record), then bench_encoders --kind ssm on
#      main and s24, then (last) on main + fwd-rowsj, fwd-rowsj's kernels' bits against main's (op_bits; top-z
#      changes GEMM shapes, so other bits: its parity tests check it), memcheck and racecheck on the forward
#      scan's and the recurrent steps' small cases (fwd-rowsj rewrote the scan's state update; ssd_step is staged).
#   L: OUT=$OUT bash docs/bench/gpu1_s24.sh L <sha>: issue 22 point 6 at 18,000 updates, seeds 0-2, attention
#      then ssm (tools/gpu_encoders.sh; three runs side by side, attention's first: the lower at 10,000 updates;
#      a chained call on the warm machine resumes the runs from their checkpoints).
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = A ]; then
t gpu_check; export CUDARL_COMMIT=$2; PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-net-variants --no-dw-variants" DEADLINE_S=300 OUT=$OUT/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > $OUT/gc.log 2>&1
cp docs/gpu-report.md $OUT/; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gc/pytest.log | tail -12; grep -E "train step \(graph|collect step|speed-up" docs/gpu-report.md | head -24
bench() {  # bench_encoders --kind ssm on the tree $1, named $2
  t "bench $2"; (cd $1 && PYTHONPATH=. timeout 80 python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_$2.json > $OUT/enc_$2.log 2>&1; grep -E "step \(graph|acting" $OUT/enc_$2.log | tail -6)
}
bench .gpu_base main; bench . s24
t bits; (cd .gpu_base && PYTHONPATH=. timeout 60 python3 ../docs/bench/op_bits.py $OUT/bits_base.npz); PYTHONPATH=. timeout 60 python3 docs/bench/op_bits.py $OUT/bits_new.npz; python3 docs/bench/op_bits.py --compare $OUT/bits_base.npz $OUT/bits_new.npz > $OUT/bits.txt 2>&1; echo "compare rc=$?"; grep -v "same bits" $OUT/bits.txt; rm -f $OUT/bits_*.npz
for tool in memcheck racecheck; do
  t $tool; timeout 90 compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py -k "(conv_and_scan_forward or steps_match) and not 512 and not 4096" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -4
done
bench .gpu_si fwd-rowsj  # last: the attribution between the two merged branches
elif [ "$1" = L ]; then
t learning; ENCODERS="attention-noise ssm-noise" GAMMA=0.5 CF=1 STEPS=18000 SEED_LIST=0,1,2 WORKERS=3 ENCODERS_LIMIT_S=${LIMIT_S:-540} CUDARL_COMMIT=$2 OUT=$OUT bash tools/gpu_encoders.sh
fi
t end
