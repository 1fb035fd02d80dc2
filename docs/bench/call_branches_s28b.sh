# NOT RUN as written: eleven failed starts left room for one call, docs/bench/call_s28c.sh (gpu_check, then the merged tree against 82c5e12 only).
# Twenty-eighth session, call 1: five branches merged on main (9935cf3) against main before them (82c5e12, .gpu_base)
# and the first three alone (02ba8a5, .gpu_mid); carry .gpu_base and .gpu_mid:
#   rm -rf .gpu_base && mkdir .gpu_base && git archive 82c5e12 cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#   rm -rf .gpu_mid && mkdir .gpu_mid && git archive 02ba8a5 cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_mid
#   OUT=$OUT bash docs/bench/call_branches_s28b.sh
# The branches: extras-early (33d5fab), vaccine-fuse (7c0122a), dx-relu (02ba8a5): predictions in
# call_branches_s28.sh (written in the twenty-seventh session). Written this session before the call:
# head-relu (d63f558; the Q head's dx GEMM applies the encoder's top ReLU backward in its epilogue): the reference
#   train step 2-4 us shorter than .gpu_mid (one act_backward, about 3 us, leaves its dx chain); horizons alone, risk
#   alone and all seven 2-4 us less than .gpu_mid; GPU MLP gradients change in the last places, CPU's not.
# pop-relu (9935cf3; the stacked network's dx as the panel nt_act with a member axis, so members stay the single
#   network's bits): at P = 64 the two activation-backward kernels (41 us each at a75a02b) leave and the two dx GEMMs
#   become the panel's 8,192 blocks (about 90-110 us each, against 147.6 / 190.5 for cuBLASLt's 32x32 algorithm):
#   joined one-kernel dW, single algorithms 2,252 us (4418de6, H200) -> 2,000-2,120 us; with the probe (whose dx
#   algorithms were faster than 32x32) 1,689 -> 1,600-1,720 us. Members == single agents bitwise (the GPU tests).
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t tests; timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/unit/test_aux_branches.py tests/unit/test_aux_heads.py \
  tests/parity/test_vaccine.py tests/unit/test_extra_heads.py tests/parity/test_gemm.py tests/unit/test_nn_grad.py tests/unit/test_rules.py \
  tests/unit/test_stacked_network.py tests/unit/test_stacked_agent.py \
  -k "extras or homeostatic or graphed or eager or vaccine or nt_act or relu or bitwise or epilogue or member" > /tmp/t.log 2>&1
grep -E "^(FAILED|ERROR)" /tmp/t.log | head -12; grep -E "passed|failed" /tmp/t.log | tail -2; cp /tmp/t.log $OUT/tests.log
for tree in . .gpu_mid .gpu_base; do
  t "bench_step $tree"; (cd $tree && PYTHONPATH=. timeout 90 python3 tools/bench_step.py --no-epoch --no-encoders --no-net-variants --no-dw-variants --no-torch --out /tmp/step.json > /tmp/step.log 2>&1; grep -E "train step|collect step" /tmp/step.log | head -3)
  t "bench_aux $tree"; (cd $tree && PYTHONPATH=. timeout 50 python3 tools/bench_aux.py --encoder mlp --no-whole --out /tmp/aux.json > /tmp/aux.log 2>&1; grep -E "aux (none|all|horizons|risk|homeostatic|vaccine) .*train step" /tmp/aux.log)
done
for tree in . .gpu_base; do
  t "bench_population $tree"; (cd $tree && PYTHONPATH=. timeout 100 python3 tools/bench_population.py --arms joined-onekernel,joined-probe --sizes 64 --no-tf32 --no-torch --out /tmp/pop.json > /tmp/pop.log 2>&1; cp /tmp/pop.log $OUT/pop_$(basename $(pwd)).log; grep -E "64" /tmp/pop.log | grep -viE "memory|bytes" | head -8)
done
t end
