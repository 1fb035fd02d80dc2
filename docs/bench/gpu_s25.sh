# Session 25's device calls, from a checkout of main with the tree of 28e3d7a (main before this session's three
# merges: scan-tc, aux-fuse, last-stage) in .gpu_base (ignored; sent by carry):
#   rm -rf .gpu_base && mkdir .gpu_base && git archive 28e3d7a cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#   G: OUT=$OUT bash docs/bench/gpu_s25.sh G <sha>: gpu_check at <sha> (every GPU test, the three branches' among
#      them; bench_step: the report of record); the report to $OUT/report.md, logs in /tmp (few files come back).
#   B: OUT=$OUT bash docs/bench/gpu_s25.sh B: the branches against 28e3d7a: op_bits on both trees (every kernel the
#      sessions changed without changing its sums, the last-bar scans among them: "same bits"), bench_encoders --kind
#      ssm (fp32 rows: last-stage; tf32 rows: last-stage and scan-tc), bench_aux --encoder mlp --no-whole (aux-fuse),
#      memcheck and racecheck on the new kernels' small cases, ncu of the last-bar kernels on both trees.
#   P: OUT=$OUT bash docs/bench/gpu_s25.sh P: ncu of the SSM train graph under net.tf32 (what the TF32 step is made of now).
# Predictions (written before the call; perf-notes): the TF32 SSM step 3.66 -> about 3.3 ms (scan-tc);
# ssd_last_forward 93 -> 20-30 us a call, ssd_last_backward 133 -> 55-65 (last-stage: about 0.25-0.3 ms off the SSM
# step, FP32 and TF32); the MLP step with all seven signals 199.3 -> 183-187 us (aux-fuse).
R=$(pwd); T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( 560 - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }  # min(step, what is left)
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = G ]; then
  t gpu_check; export CUDARL_COMMIT=$2
  PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-net-variants --no-dw-variants" DEADLINE_S=330 OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
  cp docs/gpu-report.md $OUT/report.md; grep -hE "^(FAILED|ERROR)" /tmp/gc/pytest.log | head -30 > $OUT/failures.txt
  grep -E "passed|failed" /tmp/gc/pytest.log | tail -8; head -30 $OUT/failures.txt; grep -E "train step \(graph|collect step|speed-up" docs/gpu-report.md | head -24
elif [ "$1" = B ]; then
  t bits; (cd .gpu_base && PYTHONPATH=. timeout $(left 70) python3 ../docs/bench/op_bits.py /tmp/bits_base.npz); PYTHONPATH=. timeout $(left 70) python3 docs/bench/op_bits.py /tmp/bits_new.npz
  python3 docs/bench/op_bits.py --compare /tmp/bits_base.npz /tmp/bits_new.npz > $OUT/bits.txt 2>&1; echo "compare rc=$?"; grep -v "same bits" $OUT/bits.txt | head; grep -c "same bits" $OUT/bits.txt
  for tree in .gpu_base .; do
    n=new; [ "$tree" = .gpu_base ] && n=base
    t "bench_encoders $n"; (cd $tree && PYTHONPATH=. timeout $(left 80) python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_$n.json > $OUT/enc_$n.log 2>&1; grep -E "step \(graph|acting" $OUT/enc_$n.log | tail -8)
    t "bench_aux $n"; (cd $tree && PYTHONPATH=. timeout $(left 90) python3 tools/bench_aux.py --encoder mlp --no-whole --out $OUT/aux_$n.json > $OUT/aux_$n.log 2>&1; tail -14 $OUT/aux_$n.log)
  done
  SAN="tests/parity/test_ssm.py tests/parity/test_homeostatic.py tests/parity/test_auxsgd.py"
  KS="(tc_scans or last_bar_scan or probs_control or grad_dueling or gpu_steps_match or graphed_steps) and not 512 and not 7-64 and not 5-64 and not 129"
  for tool in memcheck racecheck; do
    t $tool; timeout $(left 75) compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider $SAN -k "$KS" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -4
  done
  M=$(python3 tools/profile_step.py --metrics)
  SHOW='import os, sys; sys.path.insert(0, "tools"); import profile_step as p; from pathlib import Path
for k in p.read_csv(Path(os.environ["N"])): print(p.kernel_key(k["name"]) + ": %.1f us, %s registers, %.1f MB DRAM, %.0f FP32 ops" % (k["us"], k["regs"], k["bytes"] / 1e6, k["flops"]))'
  for tree in .gpu_base .; do
    n=new; [ "$tree" = .gpu_base ] && n=base
    t "ncu $n"; (cd $tree && PYTHONPATH=. timeout $(left 50) ncu --clock-control none --cache-control none --csv --page raw --print-units base --metrics $M -k regex:ssd_last -c 2 python3 $R/docs/bench/op_bits.py /tmp/ncu_bits.npz > /tmp/ncu_$n.csv 2> /tmp/ncu_$n.err); N=/tmp/ncu_$n.csv python3 -c "$SHOW"
  done
elif [ "$1" = P ]; then  # what is left of the TF32 SSM train step after the merges: ncu's kernels (serialised)
  S="--set net.encoder=ssm --set net.window=64 --set net.d_model=128 --set net.layers=2 --set net.ssm_expand=2 --set net.ssm_state=64 --set net.ssm_headdim=64 --set net.tf32=true"
  t profile; GRAPHS=train NCU_TIMEOUT=170 OUT=/tmp/prof timeout 190 bash tools/gpu_profile.sh $S > /tmp/prof.log 2>&1; cp /tmp/prof/profile.txt $OUT/ssm_tf32_train_profile.txt; grep -E "ncu_train|x  " /tmp/prof/profile.txt | head -40
fi
t end
