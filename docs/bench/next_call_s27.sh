# Prepared for the next session (NOT RUN ON A GPU when written): one device call, then gpu_check. From a checkout of
# main with the two prepared patches applied (they touch different files; either alone works too):
#   git am docs/bench/units.patch docs/bench/qstats-beside.patch
# and main's tree before them in .gpu_base (ignored; sent by carry):
#   rm -rf .gpu_base && mkdir .gpu_base && git archive main cudarl cuda_src tools tests pyproject.toml | tar -x -C .gpu_base
#   OUT=$OUT bash docs/bench/next_call_s27.sh
# then, chained on the warm machine: OUT=$OUT bash docs/bench/gpu_s25.sh G <sha> (gpu_check and bench_step; the report).
# Predictions (docs/perf-notes.md, twenty-sixth session): units: cold start 6.57 -> about 3.0-3.6 s, warm 1.80 ->
# about 1.1-1.2 s (bench_startup's bytecode, on main already, gives the warm part); qstats-beside: the reference
# train step about 8-12 us shorter (the path 124.0 -> 111.6 us at 2664cc6's trace), the same bits.
# Added in the twenty-seventh session before the call: bench_aux --encoder mlp on both trees, for branch qstats-early
# (q_stats forked after the forward at s, beside the learn phases): the MLP step with all seven signals 207.0 ->
# about 193-197 us (its two launches, 11-13 us, off the path where targets_loss covers them); the same bits.
# Then, if device time is left (issue 22, point 6): attention at issue 22's widths and 18,000 updates on the GPU,
# seeds 0-2 (fixed before the run: the 10,000-update GPU runs' seeds, 69/86/50%; on the CPU 18,000 updates lifted
# attention's mean from 73% to 85%), in two calls of about 540 s (the second resumes from the checkpoints):
#   ENCODERS=attention-noise GAMMA=0.5 CF=1 STEPS=18000 SEED_LIST=0,1,2 WORKERS=3 OUT=$OUT bash tools/gpu_encoders.sh
T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( 540 - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
t tests; timeout $(left 200) python3 -m pytest -m gpu -q -p no:cacheprovider tests/unit/test_aux_branches.py \
  tests/unit/test_trainer.py tests/unit/test_kernel_cache.py tests/unit/test_c51_iqn.py > /tmp/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" /tmp/tests.log | tail -12
for tree in .gpu_base .; do
  n=new; [ "$tree" = .gpu_base ] && n=base
  t "bench_startup $n"; (cd $tree && PYTHONPATH=. timeout $(left 90) python3 tools/bench_startup.py --device gpu --out $OUT/startup_$n.json > /tmp/su_$n.log 2>&1)
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(d.get('bytecode'))
for st in ('warm', 'cold'):
    rs = sorted(d['runs']['gpu'][st], key=lambda r: r['total_s']); m = rs[len(rs) // 2]
    print(st, [round(r['total_s'], 2) for r in rs], {k: round(v, 2) for k, v in m['stages_s'].items() if v > 0.03}, sorted(((round(v, 2), k) for k, v in m['nvrtc_s'].items()), reverse=True)[:5])" $OUT/startup_$n.json
  t "bench_aux $n"; (cd $tree && PYTHONPATH=. timeout $(left 45) python3 tools/bench_aux.py --encoder mlp --no-whole --out $OUT/aux_$n.json > /tmp/aux_$n.log 2>&1; grep -E "aux (none|all|homeostatic|causal) .*train step" /tmp/aux_$n.log)
  t "bench_step $n"; (cd $tree && PYTHONPATH=. timeout $(left 90) python3 tools/bench_step.py --no-epoch --no-encoders --no-net-variants --no-dw-variants --no-torch --out $OUT/step_$n.json > /tmp/step_$n.log 2>&1; grep -E "train step|collect step|phase q_stats" /tmp/step_$n.log | head -6)
done
t end
