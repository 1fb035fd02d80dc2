# Session 26's device calls after the merge of homeo-batch and res-epilogue (20a3871; its gpu_check and the A/B
# against a5e3713: docs/bench/gpu-20a3871/README.md).
#   P: OUT=$OUT bash docs/bench/gpu_s26.sh P: where the time goes now: (1) the MLP train graph with all seven
#      signals, ncu and its launch trace, and its critical path (tools/critical_path.py with this machine's
#      bench_floor.json): issue 19's step was last traced at a75a02b, eleven sessions ago; (2) ncu of the attention
#      FP32 train graph, against docs/bench/gpu-87a1f0f/attention_fp32_train_profile.txt (res-epilogue: the FP32
#      train step did not get shorter: which GEMMs did the fused residual change?).
#   L: OUT=$OUT bash docs/bench/gpu_s26.sh L: ssm at issue 22's widths on lag, 10,000 updates, seeds 0-2, with
#      eval.average_halflife = 1000 (chosen before the run: the value measured on ar and regime before); against
#      the same runs without it (84, 79, 76% of the causal reference: docs/results.md).
set -f  # the --set lists are not globs
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = P ]; then
  t floor; PYTHONPATH=. timeout 60 python3 tools/bench_floor.py --out /tmp/floor.json > /tmp/floor.log 2>&1; tail -3 /tmp/floor.log; cp /tmp/floor.json $OUT/bench_floor.json
  A="--set agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine] --set agent.causal_groups=[calendar,offset]"
  t aux_profile; FLOOR=/tmp/floor.json GRAPHS=train NCU_TIMEOUT=150 OUT=/tmp/paux timeout 200 bash tools/gpu_profile.sh $A > /tmp/paux.log 2>&1
  cp /tmp/paux/profile.txt $OUT/aux_mlp_train_profile.txt; cp /tmp/paux/critical_train.json $OUT/aux_mlp_critical.json; cp /tmp/paux/trace_train.json $OUT/aux_mlp_trace.json
  grep -A60 "critical path" /tmp/paux/profile.txt | head -70
  t att_profile; GRAPHS=train NCU_TIMEOUT=120 OUT=/tmp/patt timeout 140 bash tools/gpu_profile.sh --set net.encoder=attention --set net.window=64 --set net.d_model=128 --set net.layers=2 > /tmp/patt.log 2>&1
  cp /tmp/patt/profile.txt $OUT/attention_fp32_train_profile.txt; grep -E "x  " /tmp/patt/profile.txt | head -30
elif [ "$1" = L ]; then
  t learning; ENCODERS=ssm-noise GAMMA=0.5 CF=1 AVG=1000 SEED_LIST=0,1,2 WORKERS=3 ENCODERS_LIMIT_S=520 OUT=$OUT/enc bash tools/gpu_encoders.sh 2>&1 | tail -20
  # the paired control is in each row: tools/learning_check.py's view "last weights" (the same run's last
  # weights, ungated; the average never touches training) beside "margin=0" (the average, ungated)
elif [ "$1" = F ]; then  # at 20a3871's library code: start-up (last measured at 2664cc6) and the signals' cost on the
  # temporal encoders (21.5% on the SSM step at 2664cc6, when the step was 10.5 ms; it is about 4.1 ms now)
  t startup; PYTHONPATH=. timeout 120 python3 tools/bench_startup.py --device gpu --out $OUT/bench_startup.json > /tmp/su.log 2>&1; grep -E "first update|compile|cold|warm" /tmp/su.log | head -14
  for e in ssm attention; do
    t "bench_aux $e"; PYTHONPATH=. timeout 170 python3 tools/bench_aux.py --encoder $e --no-whole --repeats 20 --out $OUT/aux_$e.json > /tmp/aux_$e.log 2>&1; grep -E "train step|added to" /tmp/aux_$e.log | head -20
  done
elif [ "$1" = S ]; then  # branch units (compile units for optim, nn, replay, agent; bench_startup byte-compiles): start-up, then
  # gpu_check at <sha> (S <sha>): the report of record if the branch merges
  t startup; PYTHONPATH=. timeout 90 python3 tools/bench_startup.py --device gpu --out $OUT/bench_startup.json > /tmp/su.log 2>&1
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(d.get('bytecode'))
for st in ('warm', 'cold'):
    rs = sorted(d['runs']['gpu'][st], key=lambda r: r['total_s']); m = rs[len(rs) // 2]
    print(st, [round(r['total_s'], 2) for r in rs], {k: round(v, 2) for k, v in m['stages_s'].items() if v > 0.03}, m['families_compiled'], sorted(((round(v, 2), k) for k, v in m['nvrtc_s'].items()), reverse=True)[:6])" $OUT/bench_startup.json
  t gpu_check; export CUDARL_COMMIT=$2
  PARALLEL=8 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-net-variants --no-dw-variants" DEADLINE_S=230 OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
  cp docs/gpu-report.md $OUT/report.md; grep -hE "^(FAILED|ERROR)" /tmp/gc/pytest.log | head -30 > $OUT/failures.txt
  grep -E "passed|failed" /tmp/gc/pytest.log | tail -8; head -30 $OUT/failures.txt; grep -E "train step \(graph|collect step|speed-up" docs/gpu-report.md | head -12
fi
t end
