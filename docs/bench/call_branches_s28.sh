# NOT RUN as written: superseded by call_branches_s28b.sh, then by call_s28c.sh (the one call this session got).
# Prepared in the twenty-seventh session, NOT RUN (the session's device time ran out: 318 s left, refused as less
# than a start). Branches extras-early, vaccine-fuse and dx-relu (docs/bench/*.patch, in this order) against main in
# .gpu_base, one call:
#   rm -rf .gpu_base && mkdir .gpu_base && git archive main cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#   git am docs/bench/extras-early.patch docs/bench/vaccine-fuse.patch docs/bench/dx-relu.patch
#   (each applies alone on main too; together, the CPU suite passes: see the session note)
#   bash docs/bench/call_branches_s28.sh   (carry .gpu_base), then gpu_check at what is merged.
# Predictions (written before the call). extras-early: the MLP step with all seven signals 198.3 us (H200, 90539af) -> about 186-192 us
# (the two head signals' dL/dpsi GEMMs, 7-8 us each in ncu, leave the chain where homeostatic's 16 us branch covers
# them); horizons alone and risk alone 5-8 us less each; the reference step unchanged (no extra head).
# vaccine-fuse (the vaccine's dots and control step in one launch, its last block by a ticket; the same arithmetic):
# the vaccine over horizons 2-4 us less, all seven 2-4 us less again (one node of 3.4 us in ncu off the path); the
# same bits as before (by construction; tests/parity/test_vaccine.py: parity with the twin, graphed == eager).
# dx-relu (the MLP's dx GEMM applies the ReLU backward of the layer below in its epilogue, gemm.nt_act, the panel
# kernel): the reference train step 3-5 us shorter (one act_backward node, 3.0 us in ncu at 2664cc6, leaves its dx
# chain, and that dx runs as the panel product, 5.9 against 6.9 us in bench_gemm on an H100); all seven 3-5 us less
# again; the GPU's MLP gradients change in the last places (the panel's sum order for that dx), the CPU's do not.
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t tests; timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/unit/test_aux_branches.py tests/unit/test_aux_heads.py \
  tests/parity/test_vaccine.py tests/unit/test_extra_heads.py tests/parity/test_gemm.py tests/unit/test_nn_grad.py \
  -k "extras or homeostatic or graphed or eager or vaccine or nt_act or relu" > /tmp/t.log 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | tail -8
for tree in . .gpu_base; do
  t "bench_step $tree"; (cd $tree && PYTHONPATH=. timeout 90 python3 tools/bench_step.py --no-epoch --no-encoders --no-net-variants --no-dw-variants --no-torch --out /tmp/step.json > /tmp/step.log 2>&1; grep -E "train step|collect step" /tmp/step.log | head -3)
  t "bench_aux $tree"; (cd $tree && PYTHONPATH=. timeout 50 python3 tools/bench_aux.py --encoder mlp --no-whole --out /tmp/aux.json > /tmp/aux.log 2>&1; grep -E "aux (none|all|horizons|risk|homeostatic|vaccine) .*train step" /tmp/aux.log)
done
t end
