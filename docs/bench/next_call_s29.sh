# Prepared in the twenty-seventh session (as next_call_s28.sh) and NOT RUN in the twenty-seventh, twenty-eighth or
# twenty-ninth (their device time went on failed starts; the twenty-eighth's one call was call_s28c.sh, the
# twenty-ninth's call_s29.sh and the gpu_check at 89eb67b, whose report is main's GPU code). First in the next
# session with a machine: P, then L.
#   P: OUT=$OUT bash docs/bench/next_call_s29.sh P (about 120 s): the MLP train graph with all seven signals and the
#      reference train graph under ncu, their launch traces and critical paths, with the ncu CSVs kept (the
#      twenty-seventh session's profile kept only the printed table, and tools/critical_path.py now pairs library
#      kernels with calls by their FP32 FLOPs, which the CSV holds); then bench_aux --encoder mlp. What it is for:
#      where issue 19's all-seven path (23 nodes, 170.4 us at 90539af on an H200) and issue 20's reference path
#      really spend their time, node by node.
#   L: OUT=$OUT bash docs/bench/next_call_s29.sh L (about 550 s on an H200; on an H100 the runs are cut before
#      their last evaluation and a second call on the warm machine resumes them): issue 22 point 6, attention at
#      issue 22's widths and 18,000 updates on the GPU, seeds 0-2 (fixed before the run: the 10,000-update GPU
#      runs' seeds, 69/86/50%; on the CPU 18,000 updates lifted attention's mean from 73% to 85%).
set -f  # the --set lists are not globs
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = P ]; then
  PYTHONPATH=. timeout 60 python3 tools/bench_floor.py --out $OUT/bench_floor.json > /tmp/floor.log 2>&1; tail -2 /tmp/floor.log
  A="--set agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine] --set agent.causal_groups=[calendar,offset]"
  FLOOR=$OUT/bench_floor.json GRAPHS=train NCU_TIMEOUT=150 OUT=$OUT/paux timeout 200 bash tools/gpu_profile.sh $A > $OUT/paux.log 2>&1
  grep -A40 "critical path" $OUT/paux/profile.txt | tail -14
  FLOOR=$OUT/bench_floor.json GRAPHS=train NCU_TIMEOUT=100 OUT=$OUT/pref timeout 130 bash tools/gpu_profile.sh > $OUT/pref.log 2>&1
  grep -A30 "critical path" $OUT/pref/profile.txt | tail -26
  PYTHONPATH=. timeout 60 python3 tools/bench_aux.py --encoder mlp --no-whole --out $OUT/aux.json > /tmp/aux.log 2>&1
  grep -E "aux (none|all) .*train step" /tmp/aux.log; rm -f $OUT/*/ncu_*.err
elif [ "$1" = L ]; then
  ENCODERS=attention-noise GAMMA=0.5 CF=1 STEPS=18000 SEED_LIST=0,1,2 WORKERS=3 ENCODERS_LIMIT_S=545 KILL_AFTER_S=25 \
    OUT=$OUT bash tools/gpu_encoders.sh 2>&1 | tail -30
fi
