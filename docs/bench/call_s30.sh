# Session 30's device call (one start for all of it), from a checkout of main with net.gemm = "chain". NOT RUN in
# the thirtieth session (fourteen starts failed; the device time ran out): first in the next session with a
# machine, `LIMIT=575 OUT=$OUT bash docs/bench/call_s30.sh A <sha>` (or G, then B, in a shorter window).
#   A: OUT=$OUT bash docs/bench/call_s30.sh A <sha>: chain_ab.py (below), memcheck and racecheck, then gpu_check at
#      <sha> with bench_step's net.gemm variants (the report of record), in one start.
#   G: OUT=$OUT bash docs/bench/call_s30.sh G <sha>: gpu_check alone, with bench_step's net.gemm variants (chain's row).
#   B: the A/B without the aux arms, then the chain's tests (a shorter window).
#   C: OUT=$OUT bash docs/bench/call_s30.sh C: the chain's GPU tests (tests/parity/test_gemm.py and test_nn.py,
#      -k chain: the kernel layer by layer against nn_bias_act bit for bit, the 66-column input, graphed ==
#      eager, the network under "chain" against "cudarl" bit for bit, the trainer reproducible), memcheck and
#      racecheck on the kernel's small cases, then the reference step under cublaslt_nosplit (the default)
#      and chain, interleaved (ABAB), train and collect, then the per-phase profile under both (forward and
#      backward phases: the forward chain's and the backward's dx chain's shares of the difference).
# Predictions (written before the call; docs/perf-notes.md, thirtieth session): the forward chain alone, train
# 80-88 us against 95-102 under cublaslt_nosplit; with the backward's dx chain (merged before the call, branch
# chain-bwd) a further 8-15 us: train 65-80 us under chain; collect 55-65 against 76-80. Issue 19's all-seven
# MLP step (the chain's backward adding the Q head's dL/dpsi to the signals' when they ran first): 25-40 us
# shorter under chain than under cublaslt_nosplit (about 200 us), the none-arm 20-30 us shorter.
R=$(pwd); T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-580} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = A ]; then  # one start for all of it: the A/B first, the sanitizers, then gpu_check at <sha> (the report;
  # every GPU test, the chain's among them; bench_step with the net.gemm variants, chain's row among them)
  t bench; PYTHONPATH=. timeout $(left 200) python3 docs/bench/chain_ab.py 2>&1 | tail -14
  KS="chain and not 4096 and not 512"
  for tool in memcheck racecheck; do
    t $tool; PYTHONPATH=. timeout $(left 50) compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_gemm.py -k "$KS" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -4
  done
  t gpu_check; export CUDARL_COMMIT=$2; D=$(( ${LIMIT:-580} - ($(date +%s) - T0) - 15 ))
  PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-dw-variants" DEADLINE_S=$D OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
  cp docs/gpu-report.md $OUT/report.md; grep -hE "^(FAILED|ERROR)" /tmp/gc/pytest.log | head -30 > $OUT/failures.txt
  grep -E "passed|failed" /tmp/gc/pytest.log | tail -8; head -30 $OUT/failures.txt; grep -E "train step \(graph|collect step|speed-up" docs/gpu-report.md | head -24
elif [ "$1" = G ]; then  # the least device time: gpu_check at <sha> alone (every GPU test, the chain's among them;
  # bench_step with the net.gemm variants: chain's train and collect rows beside the default's, in one run)
  t gpu_check; export CUDARL_COMMIT=$2; D=$(( ${LIMIT:-580} - ($(date +%s) - T0) - 15 ))
  PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-dw-variants" DEADLINE_S=$D OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
  cp docs/gpu-report.md $OUT/report.md; cp /tmp/bench/bench_step.json $OUT/ 2>/dev/null; grep -hE "^(FAILED|ERROR)" /tmp/gc/pytest.log | head -30 > $OUT/failures.txt
  grep -E "passed|failed" /tmp/gc/pytest.log | tail -8; head -30 $OUT/failures.txt; grep -E "train step|collect step|speed-up" docs/gpu-report.md | head -40
elif [ "$1" = B ]; then  # a shorter window: the chain's kernel and network tests, then the A/B (no aux arms)
  t tests; PYTHONPATH=. timeout $(left 70) python3 -m pytest -q -p no:cacheprovider -rf tests/parity/test_gemm.py tests/parity/test_nn.py -k "chain_network or chain_is or chain_takes or chain_backward_is or chain_backward_acc or chain_graphed or chain_backward_graphed or chain_ref or chain_backward_ref" > /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -20; cp /tmp/t.log $OUT/tests.log
  t bench; NO_AUX=1 PYTHONPATH=. timeout $(left 150) python3 docs/bench/chain_ab.py 2>&1 | tail -10
elif [ "$1" = C ]; then
  t tests; PYTHONPATH=. timeout $(left 240) python3 -m pytest -q -p no:cacheprovider -rf tests/parity/test_gemm.py tests/parity/test_nn.py -k "chain or gemm_graphed or nn_bias_act" > /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -30; cp /tmp/t.log $OUT/tests.log
  KS="chain and not 4096 and not 512x"
  for tool in memcheck racecheck; do
    t $tool; PYTHONPATH=. timeout $(left 90) compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_gemm.py -k "$KS" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -4
  done
  t bench; PYTHONPATH=. timeout $(left 260) python3 docs/bench/chain_ab.py 2>&1 | tail -14
fi
t end
