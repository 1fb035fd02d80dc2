# Session 21's calls.  OUT=$OUT bash docs/bench/gpu1_s21.sh A|A2|A3|B|B2 <sha>
# A: 1. diag_att.py (the attention encoder's per-parameter gradient errors on the GPU against float64) over this
#       tree (every bar in every block) and over .gpu_att (main at af9602a with 3070d5e reverted: the last-bar top
#       block), seeds 0-2, and .gpu_att's attention parity tests.
#    2. The SSM scan's GPU tests (states for chunks 2..n only; one chunk over the window), compute-sanitizer
#       memcheck on them and the last-bar kernels (49f4539's padding).
#    3. bench_encoders --kind ssm --no-torch: this tree at chunk 32 and 64, and .gpu_base (main at af9602a) at 32.
#    .gpu_att and .gpu_base were made with `git archive <commit> cudarl cuda_src tools [tests docs/bench]`, ignored
#    through .git/info/exclude and sent with the call's carry.
# B: gpu_check at <sha> (the report). B2: the SSM train graph under ncu with the scans' stall reasons.
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = A ]; then  # as it ran first (4a90fb5)
for s in 0 1 2; do
  t "diag every-bar seed $s"; PYTHONPATH=. timeout 60 python3 docs/bench/diag_att.py tests/parity $s 2>&1 | tail -6
  t "diag last-bar seed $s"; (cd .gpu_att && PYTHONPATH=. timeout 60 python3 docs/bench/diag_att.py tests/parity $s 2>&1 | tail -6)
done
t "last-bar attention parity"; (cd .gpu_att && timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_encoder_parity.py tests/parity/test_attention.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -8)
t "ssm tests"; timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_encoder_parity.py tests/unit/test_encoders.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -8
K="(last_bar_scan or conv_and_scan) and not 512 and not 4096"
t memcheck; timeout 100 compute-sanitizer --tool memcheck --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py -k "$K" 2>&1 | grep -E "ERROR SUMMARY|Invalid|passed|failed" | tail -4
for q in 32 64; do
  t "bench chunk $q"; PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --chunk $q --out $OUT/enc_q$q.json > $OUT/enc_q$q.log 2>&1; grep -E "step|acting" $OUT/enc_q$q.log | tail -12
done
t "bench base"; (cd .gpu_base && PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --out $OUT/enc_base.json > $OUT/enc_base.log 2>&1; grep -E "step|acting" $OUT/enc_base.log | tail -12)
elif [ "$1" = A2 ]; then  # after A: the failing test's own data, with and without a poisoned pool; the SSM's fixes
for tree in . .gpu_att; do for pz in "" poison; do
  t "diag $tree test-data $pz"; (cd $tree && PYTHONPATH=. timeout 60 python3 docs/bench/diag_att.py tests/parity test $pz 2>&1 | tail -7)
done; done
t "ssm tests"; timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py tests/parity/test_encoder_parity.py tests/unit/test_encoders.py tests/unit/test_kernels_loader.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -12
K="(last_bar_scan or conv_and_scan or steps_match) and not 512 and not 4096"
t memcheck; timeout 100 compute-sanitizer --tool memcheck --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_ssm.py -k "$K" 2>&1 | grep -E "ERROR SUMMARY|Invalid|passed|failed" | tail -4
for q in 64 32; do
  t "bench chunk $q"; PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --chunk $q --out $OUT/enc_q$q.json > $OUT/enc_q$q.log 2>&1; grep -E "step|acting|failed" $OUT/enc_q$q.log | tail -12
done
elif [ "$1" = A3 ]; then  # after A2: every parameter on the test's data; the test itself in the last-bar tree
# (.gpu_att now holds pyproject.toml, so its node ids, and the rng fixture's seeds, are the main tree's); chunk 16
for tree in . .gpu_att; do
  t "diag $tree test-data"; (cd $tree && PYTHONPATH=. timeout 60 python3 docs/bench/diag_att.py tests/parity test 2>&1 | tail -30)
done
t "last-bar attention tests"; (cd .gpu_att && timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_encoder_parity.py tests/parity/test_attention.py tests/unit/test_encoders.py 2>&1 | grep -E "^(FAILED|ERROR|E  )|passed|failed" | tail -12)
t "bench chunk 16"; PYTHONPATH=. timeout 90 python3 tools/bench_encoders.py --kind ssm --no-torch --chunk 16 --out $OUT/enc_q16.json > $OUT/enc_q16.log 2>&1; grep -E "step|acting|failed" $OUT/enc_q16.log | tail -12
elif [ "$1" = B ]; then
export CUDARL_COMMIT=$2; PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-net-variants --no-dw-variants" DEADLINE_S=330 OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > $OUT/gc.log 2>&1; cp docs/gpu-report.md /tmp/gc/pytest.log $OUT/; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/gc/pytest.log | tail -12; grep -E "train step \(graph|collect step|speed-up" docs/gpu-report.md
elif [ "$1" = B2 ]; then  # after B, on the warm machine, as it ran (two commands): the SSM train graph's kernels
# under ncu, then a detail pass (stall reasons) over the scan kernels, at issue 22's workload
S="--set net.encoder=ssm --set net.window=64 --set net.d_model=128 --set net.layers=2 --set net.ssm_expand=2 --set net.ssm_state=64 --set net.ssm_headdim=64"
GRAPHS=train NCU_TIMEOUT=170 OUT=$OUT/prof timeout 190 bash tools/gpu_profile.sh $S > $OUT/prof.log 2>&1; tail -45 $OUT/prof/profile.txt
GRAPHS=train NCU_DETAIL='ssd_forward|ssd_backward|ssd_last' NCU_TIMEOUT=60 OUT=$OUT/prof timeout 170 bash tools/gpu_profile.sh $S > $OUT/prof.log 2>&1
fi
t end
