# Session 22's calls.  OUT=$OUT bash docs/bench/gpu1_s22.sh C|D <sha>  (D ran first without the tgz, at 50aaa21)
# C: test_gpu_members_are_single_agents_checkpoints failed in gpu_check at 25cd9b3 (member 2 exported through a
#    file and loaded into a fresh agent: its first update differs from the member's, every leaf; passed at
#    fb169ad, where the test files were dealt to other processes). Is it a read of memory nothing wrote
#    (depends on the pool the tests before left) or a race (depends on load)? The test file alone, plain
#    and with the pool poisoned (CUDARL_POISON_POOL=1); its gpu_check process again (the same files
#    in one process); then the whole GPU suite poisoned (gpu_check --only-tests --poison).
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = C ]; then
T=tests/unit/test_stacked_checkpoint.py
for p in 0 1; do  # the first also compiles the kernels
  t "alone poison=$p"; CUDARL_POISON_POOL=$p timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider $T 2>&1 | grep -E "^E  .*(leaves|differ)|passed|failed" | head -8
done
mapfile -t F < <(find tests -name 'test_*.py' | sort); G=()
for i in "${!F[@]}"; do (( i % 6 == 1 )) && G+=("${F[$i]}"); done
t "group 1 of 6 as gpu_check dealt it"; timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider "${G[@]}" 2>&1 | grep -E "^E  .*(leaves|differ)|^FAILED|passed|failed" | head -12
t "suite poisoned"; CUDARL_COMMIT=$2 PARALLEL=6 OUT=$OUT/poison BENCH_DIR=/tmp/bench timeout 280 bash tools/gpu_check.sh --only-tests --poison > $OUT/poison.log 2>&1
grep -E "^(FAILED|ERROR)|GPU tests:" $OUT/poison.log | head -30
elif [ "$1" = D ]; then  # after C (every run passed, the poisoned suite too): a race, under load?
t warm; timeout 120 python3 docs/bench/diag_ckpt.py $OUT/d_warm.json
python3 -c "import cupy as cp,time;a=cp.ones((8192,8192),cp.float32);t=time.time()
while time.time()-t<100: a@a" & LOAD=$!
for round in 1 2 3; do
  t "round $round: 12 copies side by side, a GEMM loop beside them"
  for k in $(seq 1 12); do DIAG_SYNC_AT_ADAM=$(( round % 2 )) timeout 120 python3 docs/bench/diag_ckpt.py $OUT/d_${round}_$k.json & done
  wait $(jobs -p | grep -v $LOAD)
done
kill $LOAD 2>/dev/null
t compare; python3 docs/bench/diag_ckpt_compare.py $OUT/d_*.json
cd $OUT && tar czf diag.tgz d_*.json* && rm -f d_*.json*; cd - >/dev/null
fi
t end
# E (after D found it, at the fix): the new GPU test here and over .gpu_base (this tree with cudarl/blas.py
#    as it was at 3cce583: it must fail there), then D's rounds here (no failure expected in 36 runs).
if [ "$1" = E ]; then
N="tests/unit/test_graph.py::test_gpu_a_new_streams_cublas_warm_up_waits_for_the_callers_pending_work"
t "new test, fixed"; timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider $N tests/unit/test_graph.py tests/parity/test_gemm.py 2>&1 | grep -E "^E  .*overwritten|^FAILED|passed|failed" | tail -4
t "new test, blas as it was"; (cd .gpu_base && timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider $N 2>&1 | grep -E "^E  .*overwritten|passed|failed" | tail -3)
bash "$0" D "$2" | grep -E "Adam.mask|runs:|== "
fi
# F: the GPU test made to fail without the fix (E's passed over .gpu_base too: earlier owners' queued handle
#    releases, each a cublasDestroy, can synchronise inside prepare; now released before the spin), over
#    .gpu_base and here, then gpu_check at <sha>.
if [ "$1" = F ]; then
N="tests/unit/test_graph.py::test_gpu_a_new_streams_cublas_warm_up_waits_for_the_callers_pending_work"
for tree in .gpu_base .; do
  t "new test in $tree"; (cd $tree && timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/unit/test_graph.py 2>&1 | grep -E "^E  .*overwritten|^FAILED|passed|failed" | tail -3)
done
t gpu_check; export CUDARL_COMMIT=$2; PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-net-variants --no-dw-variants" DEADLINE_S=330 OUT=$OUT/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > $OUT/gc.log 2>&1
grep -E "GPU tests:|^FAILED" $OUT/gc.log | head; cp docs/gpu-report.md $OUT/
fi
# G (branch gemm-probe): net.gemm_algo = "probe" (the linear layers' one-kernel cuBLASLt GEMMs probed as a batch of
#    one): its GPU tests (each probed GEMM bitwise the heuristic's, trainers bit for bit), the batched probe's
#    tests, then bench_encoders with both choices (speed-up, bits, plans changed).
if [ "$1" = G ]; then
t tests; timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -s tests/unit/test_gemm_algo.py tests/parity/test_blas.py -k "probe or plan" 2>&1 | grep -E "^E  |^FAILED|probed, equal|passed|failed" | tail -30
t bench; PYTHONPATH=. timeout 170 python3 tools/bench_encoders.py --kind both --no-torch --gemm-algo both --out $OUT/enc_probe.json > $OUT/enc_probe.log 2>&1
grep -E "step \(graph|probe vs|failed" $OUT/enc_probe.log | tail -24
fi
