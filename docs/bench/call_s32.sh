# Session 32's first device call: `LIMIT=590 OUT=$OUT bash docs/bench/call_s32.sh A <sha>`.
#   A: gpu_check at <sha> (the report of record; bench_step with its net.gemm variants), then the critical
#      paths of the reference train graph and of the MLP train graph with all seven signals (ncu, traces,
#      tools/critical_path.py over bench_floor.json: next_call_s29.sh P, never run before), then bench_aux
#      --encoder mlp if time is left.
# Predictions (written before the call): the reference path is sample (11-16 us), the three forward GEMMs
# (30-34 us), targets_loss (13-16), the backward's dx chain and first-layer dW (33-37), adam (8-10) and the
# publish (2-3), 95-115 us of serialised kernel time; the all-seven path adds causal's and vaccine's extra
# backwards and homeostatic's kernels, 180-230 us of serialised kernel time.
set -f
R=$(pwd); T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-580} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = A ]; then
  t gpu_check; export CUDARL_COMMIT=$2
  PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-dw-variants" DEADLINE_S=$(left 300) OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
  cp docs/gpu-report.md $OUT/report.md; cp /tmp/bench/bench_step.json $OUT/ 2>/dev/null; grep -hE "^(FAILED|ERROR)" /tmp/gc/pytest.log | head -30 > $OUT/failures.txt
  grep -E "passed|failed" /tmp/gc/pytest.log | tail -4; head -30 $OUT/failures.txt; grep -E "train step \(graph|collect step|speed-up" docs/gpu-report.md | head -12
  t floor; PYTHONPATH=. timeout $(left 60) python3 tools/bench_floor.py --out $OUT/bench_floor.json > /tmp/floor.log 2>&1; tail -2 /tmp/floor.log
  t pref; FLOOR=$OUT/bench_floor.json GRAPHS=train NCU_TIMEOUT=$(left 90) OUT=$OUT/pref timeout $(left 120) bash tools/gpu_profile.sh > $OUT/pref.log 2>&1
  grep -A34 "critical path" $OUT/pref/profile.txt | tail -34
  A="--set agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine] --set agent.causal_groups=[calendar,offset]"
  t paux; FLOOR=$OUT/bench_floor.json GRAPHS=train NCU_TIMEOUT=$(left 120) OUT=$OUT/paux timeout $(left 150) bash tools/gpu_profile.sh $A > $OUT/paux.log 2>&1
  grep -A60 "critical path" $OUT/paux/profile.txt | tail -60
  t aux; PYTHONPATH=. timeout $(left 70) python3 tools/bench_aux.py --encoder mlp --no-whole --out $OUT/aux.json > /tmp/aux.log 2>&1
  grep -E "train step" /tmp/aux.log | head -12; rm -f $OUT/*/ncu_*.err
fi
t end
# B (second call): `LIMIT=560 OUT=$OUT bash docs/bench/call_s32.sh B`: agent.aux_gemm (the denoise and causal
#    passes' GEMMs over their 64 rows) measured: bench_gemm's panel arm with the 64-row shapes and a split-K
#    cuBLASLt column; the new GPU tests and the signals' graphed == eager tests; bench_aux (none, all, causal,
#    denoise) under aux_gemm = net, cudarl and cublaslt; the all-seven critical path under cudarl.
#    Predictions (written before the call): at 64 rows the one-kernel cuBLASLt dx GEMM (64x256x256) about
#    15-21 us in the graph of 20, the panel 5-9 us, split-K cuBLASLt 6-10 us (two kernels); under cudarl
#    the causal arm's added cost 13.7 -> 5-9 us, denoise's 32.4 -> 18-25 us, all seven 208.8 -> 170-185 us
#    (+66-81% of none); the causal pass's path of 86.7 us of serialised kernels -> 55-65 us, and the
#    all-seven critical path no longer through the aux_causal phase's GEMMs alone.
if [ "$1" = B ]; then
  t gemm; PYTHONPATH=. timeout $(left 70) python3 tools/bench_gemm.py --arms panel --out $OUT/bench_gemm.json > /tmp/gemm.log 2>&1
  grep -E "64x|512x256x256" /tmp/gemm.log | head -40
  t tests; PYTHONPATH=. timeout $(left 200) python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/unit/test_aux_gemm.py tests/unit/test_aux_all.py tests/unit/test_aux_cost.py tests/unit/test_aux_branches.py > /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -20; cp /tmp/t.log $OUT/tests.log
  for g in net cudarl cublaslt; do
    t aux_$g; PYTHONPATH=. timeout $(left 80) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all,causal,denoise --aux-gemm $g --out $OUT/aux_$g.json > /tmp/aux_$g.log 2>&1
    grep -E "train step|added to" /tmp/aux_$g.log | head -8
  done
  A="--set agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine] --set agent.causal_groups=[calendar,offset] --set agent.aux_gemm=cudarl"
  t paux; PYTHONPATH=. timeout $(left 30) python3 tools/bench_floor.py --out $OUT/bench_floor.json > /tmp/floor.log 2>&1
  FLOOR=$OUT/bench_floor.json GRAPHS=train NCU_TIMEOUT=$(left 90) OUT=$OUT/paux timeout $(left 110) bash tools/gpu_profile.sh $A > $OUT/paux.log 2>&1
  grep -A40 "critical path" $OUT/paux/profile.txt | tail -40; cp $OUT/paux/critical_train.json $OUT/critical_aux_cudarl.json 2>/dev/null
  t end
fi
# C (third call): `LIMIT=400 OUT=$OUT bash docs/bench/call_s32.sh C`: the Q head's dx added in place onto the
#    extra heads' dL/dpsi (one cuBLASLt GEMM, C == D) where cuBLAS's beta = 1 ran split K and a reduction
#    kernel (the second call's all-seven path: cublas_sgemm splitKreduce 10.6 us on the backward's head);
#    its tests and the signals' GPU tests; bench_aux under aux_gemm = net and cudarl.
#    Predictions (written before the call): the horizons arm 115.6 -> 111-114 us; all seven 206.5 -> 200-204
#    (net) and 204.7 -> 198-202 (cudarl); none unchanged (no extra head: no accumulate).
if [ "$1" = C ]; then
  t tests; PYTHONPATH=. timeout $(left 200) python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/unit/test_aux_gemm.py tests/parity/test_nn.py tests/unit/test_aux_all.py tests/unit/test_extra_heads.py tests/unit/test_aux_branches.py tests/unit/test_aux_heads.py > /tmp/t.log 2>&1
  PYTHONPATH=. timeout $(left 60) python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/parity/test_blas.py -k "residual or in_place" >> /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -20; cp /tmp/t.log $OUT/tests.log
  for g in net cudarl; do
    t aux_$g; PYTHONPATH=. timeout $(left 80) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all,horizons,vaccine,causal,denoise --aux-gemm $g --out $OUT/aux_$g.json > /tmp/aux_$g.log 2>&1
    grep -E "train step|added to" /tmp/aux_$g.log | head -14
  done
  t end
fi
# D (fourth call): `LIMIT=300 OUT=$OUT bash docs/bench/call_s32.sh D`: denoise's pass as an early phase (forked
#    right after sample, where it forked after the rule's loss phases: the same bits, by construction); the
#    signals' GPU tests; bench_aux with the ablation arms (all seven less one each).
#    Predictions (written before the call): the denoise arm 132.6 -> 105-112 us (+2-9 over none, from +29);
#    all seven 187.7 -> 165-180 us; the ablation names the signals whose branches hold the step.
if [ "$1" = D ]; then
  t tests; PYTHONPATH=. timeout $(left 150) python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/unit/test_aux_all.py tests/unit/test_aux_branches.py tests/unit/test_aux_heads.py tests/unit/test_aux_cost.py tests/unit/test_aux_gemm.py > /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -20; cp /tmp/t.log $OUT/tests.log
  t aux; PYTHONPATH=. timeout $(left 120) python3 tools/bench_aux.py --encoder mlp --no-whole --arms ablation,denoise,causal,horizons,vaccine,risk,homeostatic,selectivity --out $OUT/aux_ablation.json > /tmp/aux.log 2>&1
  grep -E "train step|added to|removed" /tmp/aux.log | head -40
  t end
fi
# E (fifth call): `LIMIT=300 OUT=$OUT bash docs/bench/call_s32.sh E`: Gradient Vaccine's own backward without
#    the Q head's (QNetwork.backward(q_head=False): it ran the Q head's dueling backward and dx GEMM over zero
#    rows, and two fills to zero them, on its branch's chain); the signals' GPU tests; bench_aux again.
#    Predictions (written before the call): the vaccine arm (horizons + vaccine) 144.4 -> 125-135 us; all
#    seven 183.1 -> 165-172 us; "all but vaccine" unchanged (146.3).
if [ "$1" = E ]; then
  t tests; PYTHONPATH=. timeout $(left 150) python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/unit/test_aux_all.py tests/unit/test_aux_branches.py tests/unit/test_aux_reg.py tests/unit/test_extra_heads.py tests/unit/test_aux_gemm.py > /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -20; cp /tmp/t.log $OUT/tests.log
  t aux; PYTHONPATH=. timeout $(left 120) python3 tools/bench_aux.py --encoder mlp --no-whole --arms ablation,denoise,causal,horizons,vaccine,risk,homeostatic,selectivity --out $OUT/aux_ablation.json > /tmp/aux.log 2>&1
  grep -E "train step|added to|removed" /tmp/aux.log | head -40
  t end
fi
# F (sixth call): `LIMIT=300 OUT=$OUT bash docs/bench/call_s32.sh F`: causal's intervened forward without the
#    extra heads (its backward then runs only the Q head's); Gradient Vaccine's backward from a copy of the
#    extras_backward phase's dL/dpsi (util.copy_u32, new), forked there, the encoder's part alone; the
#    signals' and util's GPU tests, memcheck and racecheck on util's; bench_aux with the ablation.
#    Predictions (written before the call): the causal arm 114.8 -> 108-112 us; the vaccine arm 128.9 ->
#    118-124 us; all seven 165.3 -> 150-158 us.
if [ "$1" = F ]; then
  t tests; PYTHONPATH=. timeout $(left 170) python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/unit/test_aux_all.py tests/unit/test_aux_branches.py tests/unit/test_aux_reg.py tests/unit/test_extra_heads.py tests/parity/test_util.py tests/parity/test_causal.py tests/unit/test_aux_heads.py > /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -20; cp /tmp/t.log $OUT/tests.log
  for tool in memcheck racecheck; do
    t $tool; PYTHONPATH=. timeout $(left 40) compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_util.py -k copy 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -3
  done
  t aux; PYTHONPATH=. timeout $(left 120) python3 tools/bench_aux.py --encoder mlp --no-whole --arms ablation,denoise,causal,horizons,vaccine,risk,homeostatic,selectivity --out $OUT/aux_ablation.json > /tmp/aux.log 2>&1
  grep -E "train step|added to|removed" /tmp/aux.log | head -40
  t end
fi
# G (seventh call): `LIMIT=300 OUT=$OUT bash docs/bench/call_s32.sh G`: the auxiliary heads' losses and the
#    extras_backward phase forked from the extra heads' branch at s (buffers.after_extras), no longer after
#    the rule's loss on the main stream: the same kernels and bits; the signals' GPU tests; bench_aux.
#    Predictions (written before the call): the horizons arm 113.6 -> 104-109 us, risk 111.8 -> 103-108;
#    all seven 160.5 -> 147-155 us.
if [ "$1" = G ]; then
  t tests; PYTHONPATH=. timeout $(left 170) python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/unit/test_aux_all.py tests/unit/test_aux_branches.py tests/unit/test_aux_reg.py tests/unit/test_extra_heads.py tests/unit/test_aux_heads.py tests/unit/test_aux_gemm.py > /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -20; cp /tmp/t.log $OUT/tests.log
  t aux; PYTHONPATH=. timeout $(left 120) python3 tools/bench_aux.py --encoder mlp --no-whole --arms ablation,denoise,causal,horizons,vaccine,risk,homeostatic,selectivity --out $OUT/aux_ablation.json > /tmp/aux.log 2>&1
  grep -E "train step|added to|removed" /tmp/aux.log | head -40
  t end
fi
# H (the last call): `LIMIT=560 OUT=$OUT bash docs/bench/call_s32.sh H <sha>`: bench_aux on the MLP (the
#    ablation and each signal alone) with causal's penalty forked from the q_stats branch; gpu_check at <sha>
#    (the report of record); then, while time is left, bench_aux's none and all arms on the SSM and the
#    attention encoders (issue 19's bound on the temporal encoders, last measured at 20a3871).
#    Predictions (written before the call): the causal arm 115.6 -> 105-110 us; all seven 154.3 -> 143-150
#    us (+41-48% of none); the SSM's and attention's all seven at most +30% (22.9% and 26.6% at 20a3871).
if [ "$1" = H ]; then
  t aux; PYTHONPATH=. timeout $(left 100) python3 tools/bench_aux.py --encoder mlp --no-whole --arms ablation,denoise,causal,horizons,vaccine,risk,homeostatic,selectivity --out $OUT/aux_mlp.json > /tmp/aux.log 2>&1
  grep -E "train step|added|removed" /tmp/aux.log | head -44
  t gpu_check; export CUDARL_COMMIT=$2
  PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-dw-variants" DEADLINE_S=$(left 320) OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
  cp docs/gpu-report.md $OUT/report.md; cp /tmp/bench/bench_step.json $OUT/ 2>/dev/null; grep -hE "^(FAILED|ERROR)" /tmp/gc/pytest.log | head -30 > $OUT/failures.txt
  grep -E "passed|failed" /tmp/gc/pytest.log | tail -4; head -30 $OUT/failures.txt; grep -E "train step \(graph|collect step" docs/gpu-report.md | head -4
  for enc in ssm attention; do
    t aux_$enc; PYTHONPATH=. timeout $(left 60) python3 tools/bench_aux.py --encoder $enc --no-whole --arms all --repeats 30 --out $OUT/aux_$enc.json > /tmp/aux_$enc.log 2>&1
    grep -E "train step|share" /tmp/aux_$enc.log | head -4
  done
  t end
fi
