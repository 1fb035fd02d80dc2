# Prepared in the twenty-seventh session, NOT RUN (the session's device time ran out: 318 s left, refused as less
# than a start). Branch extras-early (docs/bench/extras-early.patch) against main in .gpu_base, one call:
#   rm -rf .gpu_base && mkdir .gpu_base && git archive main cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#   git am docs/bench/extras-early.patch docs/bench/vaccine-fuse.patch   (they apply alone or together)
#   bash docs/bench/call_extras_early.sh   (carry .gpu_base), then gpu_check if it is merged.
# Prediction (written before the call): the MLP step with all seven signals 198.3 us (H200, 90539af) -> about 186-192 us
# (the two head signals' dL/dpsi GEMMs, 7-8 us each in ncu, leave the chain where homeostatic's 16 us branch covers
# them); horizons alone and risk alone 5-8 us less each; the reference step unchanged (no extra head).
# vaccine-fuse (the vaccine's dots and control step in one launch, its last block by a ticket; the same arithmetic):
# the vaccine over horizons 2-4 us less, all seven 2-4 us less again (one node of 3.4 us in ncu off the path); the
# same bits as before (by construction; tests/parity/test_vaccine.py: parity with the twin, graphed == eager).
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t tests; timeout 80 python3 -m pytest -m gpu -q -p no:cacheprovider tests/unit/test_aux_branches.py tests/unit/test_aux_heads.py \
  tests/parity/test_vaccine.py tests/unit/test_extra_heads.py -k "extras or homeostatic or graphed or eager or vaccine" > /tmp/t.log 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | tail -8
for tree in . .gpu_base; do
  t "bench_aux $tree"; (cd $tree && PYTHONPATH=. timeout 50 python3 tools/bench_aux.py --encoder mlp --no-whole --out /tmp/aux.json > /tmp/aux.log 2>&1; grep -E "aux (none|all|horizons|risk|homeostatic|vaccine) .*train step" /tmp/aux.log)
done
t end
