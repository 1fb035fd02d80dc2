# Prepared for the next device call (branch last-stage; NOT RUN ON A GPU when written), from a checkout of last-stage
# with main's tree in .gpu_base (ignored; sent by carry):
#   mkdir .gpu_base && git archive main cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#   OUT=$OUT bash docs/bench/next_call_s25_last.sh
# last-stage: ssd_last_forward / ssd_last_backward read the window's B and x rows from shared memory, staged a tile of
# up to 64 bars at a time with cp.async (ssm.cu's banner); every sum keeps its terms, order and expression, so the
# bits should be main's. In order of what a short call must not miss:
#   1. the last-bar GPU tests (the float64 twin, windows of 2 and 3 tiles, the 4-byte copies bitwise the 16-byte ones);
#   2. op_bits on both trees, compared bit for bit: its 5 last-bar shapes and every earlier kernel must say "same bits";
#   3. compute-sanitizer memcheck and racecheck on the small last-bar cases;
#   4. ncu on both trees: the two kernels at the workload (op_bits' first last-bar shape: B 512, W 64, H 4, P = N = 64);
#   5. bench_encoders --kind ssm --no-torch on both trees;
#   6. the other SSM and encoder GPU tests, with what is left of the 395 s.
# Predicted (not measured; perf-notes, twenty-fifth session): ssd_last_forward 93 -> 20-30 us a call, ssd_last_backward
# 133 -> 55-65 us (H100, fb169ad's profile), about 0.25-0.3 ms off the SSM train step.
R=$(pwd); T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( 395 - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }  # min(step, what is left)
nvidia-smi --query-gpu=name --format=csv,noheader
K=last_bar_scan
t "last-bar tests"; timeout $(left 90) python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py -k $K > $OUT/last_tests.log 2>&1; grep -E "^(FAILED|ERROR|E  )|passed|failed" $OUT/last_tests.log | tail -12
t bits; (cd .gpu_base && PYTHONPATH=. timeout $(left 60) python3 ../docs/bench/op_bits.py $OUT/bits_base.npz); PYTHONPATH=. timeout $(left 60) python3 docs/bench/op_bits.py $OUT/bits_new.npz; python3 docs/bench/op_bits.py --compare $OUT/bits_base.npz $OUT/bits_new.npz > $OUT/bits.txt 2>&1; echo "compare rc=$?"; grep -v "same bits" $OUT/bits.txt; grep -c "same bits" $OUT/bits.txt; rm -f $OUT/bits_*.npz
for tool in memcheck racecheck; do
  t $tool; timeout $(left 60) compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py -k "$K and not 512 and not 7-64 and not 5-64 and not 129" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -4
done
M=$(python3 tools/profile_step.py --metrics)  # time, launch shape, registers, DRAM bytes, FP32 ops
# the FP32 ops (2 FFMA + FADD + FMUL, thread instructions) should be equal on both trees: the same sums
SHOW='import os, sys; sys.path.insert(0, "tools"); import profile_step as p; from pathlib import Path
for k in p.read_csv(Path(os.environ["N"])): print(p.kernel_key(k["name"]) + ": %.1f us, %s registers, %.1f MB DRAM, %.0f FP32 ops" % (k["us"], k["regs"], k["bytes"] / 1e6, k["flops"]))'
for tree in .gpu_base .; do
  n=last-stage; [ "$tree" = .gpu_base ] && n=main
  t "ncu $n"; (cd $tree && PYTHONPATH=. timeout $(left 60) ncu --clock-control none --cache-control none --csv --page raw --print-units base --metrics $M -k regex:ssd_last -c 2 python3 $R/docs/bench/op_bits.py /tmp/ncu_bits.npz > $OUT/ncu_$n.csv 2> $OUT/ncu_$n.err); N=$OUT/ncu_$n.csv python3 -c "$SHOW"
done
for tree in .gpu_base .; do
  n=last-stage; [ "$tree" = .gpu_base ] && n=main
  t "bench $n"; (cd $tree && PYTHONPATH=. timeout $(left 75) python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_$n.json > $OUT/enc_$n.log 2>&1; grep -E "step \(graph|phase|acting" $OUT/enc_$n.log | tail -8)
done
t "other tests"; timeout $(left 200) python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_encoder_parity.py -k "not $K" > $OUT/other_tests.log 2>&1; echo "rc=$? (124: out of time)"; grep -E "^(FAILED|ERROR|E  )|passed|failed" $OUT/other_tests.log | tail -8
t end
