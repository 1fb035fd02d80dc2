# Prepared in session 33 for the next session's first device call, on branch next34 (main at 8e9cbd5 with the
# unmerged branches vc-fused and parity-floor merged; checked out in the working tree the device tool copies):
#   LIMIT=<s> OUT=$OUT bash docs/bench/call_s34.sh A <sha>
# A: the branches' GPU tests first (vaccine's one launch: parity and bit for bit against the two launches,
#    graphed == eager, its trace tests; the encoder parity tests under their per-gradient floors), memcheck and
#    racecheck on the one launch, bench_aux all/none in five interleaved rounds and the ablation, then
#    gpu_check at <sha> (every GPU test; docs/gpu-report.md).
#    Predictions (written in session 33, before any call): every GPU test passes, the six encoder parity cases
#    included (their errors at most 3.44e-5 against floors of 1.1e-4 to 3.9e-4 at 512 x 64); memcheck 0 errors,
#    racecheck 0 hazards; the all-seven MLP step 2-3 us shorter than at 4eeb11d (143.4-144.5 us on an H100),
#    its share of the step over the five rounds 40-44% (at 4eeb11d: 41.7-45.9%).
#    Session 34: the first try of A (at 69ca83a, next34 merged into main) got no machine; A then ran at 7b8ec24,
#    which adds causal's three nodes off its branch (intervene reading the sub-batch's rows; q_s's gather and
#    the reduce on branches of their own), with test_causal.py among the tests and intervene under memcheck.
#    Predictions for that (session 34, before the call): all GPU tests pass; the all-seven MLP step 134-140 us
#    with none at 98-102 (+36 to +40%); in the ablation causal's row from 9.0 us to 1-4 us.
#    That try got no machine either (five tries, each refused); A then ran at e020b55 (749c754 and this script), which also moves
#    vaccine's copy of the extra heads' dL/dpsi off the step's chain (the Q head's dx GEMM reads it as its
#    addend, C != D), with test_nn.py -k addend among the tests. Predictions (before the call): all GPU tests
#    pass; all seven 132-139 us, none 98-102 (+33 to +39%); the ablation's horizons row (2.8 us at 4eeb11d)
#    1-3 us. Measured (an H100): 2,253 GPU tests passed, 1 failed (a trace test 749c754 made wrong); all seven
#    148.1 us, none 101.5 (+46.0%): missed; causal's row 8.7 us: missed; horizons 2.1 us (docs/perf-notes.md).
set -f
R=$(pwd); T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-500} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = A ]; then
  t tests; PYTHONPATH=. timeout $(left 120) python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/parity/test_vaccine.py tests/parity/test_encoder_parity.py tests/parity/test_causal.py tests/unit/test_aux_branches.py "tests/parity/test_nn.py::test_gpu_linear_dx_with_an_addend_is_the_in_place_sum_bit_for_bit" > /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|^E .*relative|passed|failed" /tmp/t.log | head -12; cp /tmp/t.log $OUT/tests.log
  t memcheck; PYTHONPATH=. timeout $(left 60) compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/parity/test_vaccine.py -k one_launch > /tmp/mc.log 2>&1
  grep -E "ERROR SUMMARY|passed|failed" /tmp/mc.log | tail -3
  PYTHONPATH=. timeout $(left 45) compute-sanitizer --tool memcheck --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/parity/test_causal.py -k intervene > /tmp/mc2.log 2>&1
  grep -E "ERROR SUMMARY|passed|failed" /tmp/mc2.log | tail -3
  t racecheck; PYTHONPATH=. timeout $(left 60) compute-sanitizer --tool racecheck --print-limit 5 python3 -m pytest -m gpu -q -p no:cacheprovider -x tests/parity/test_vaccine.py -k "one_launch and not graphed" > /tmp/rc.log 2>&1
  grep -E "RACECHECK SUMMARY|passed|failed" /tmp/rc.log | tail -3
  t rounds; PYTHONPATH=. timeout $(left 90) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all --rounds 5 --out $OUT/aux_rounds.json > /tmp/aux.log 2>&1
  grep -E "graph replay|share" /tmp/aux.log | grep -v round | head -8
  t ablation; PYTHONPATH=. timeout $(left 90) python3 tools/bench_aux.py --encoder mlp --no-whole --arms ablation --out $OUT/aux_ablation.json > /tmp/abl.log 2>&1
  grep -E "removed" /tmp/abl.log | head -8
  t gpu_check; export CUDARL_COMMIT=$2; D=$(( ${LIMIT:-500} - ($(date +%s) - T0) - 15 ))
  PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-dw-variants" DEADLINE_S=$D OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
  cp docs/gpu-report.md $OUT/report.md; cp /tmp/bench/bench_step.json $OUT/ 2>/dev/null; cp /tmp/gc/pytest.log $OUT/pytest.log 2>/dev/null
  grep -E "passed|failed" /tmp/gc/pytest.log | tail -4; grep -hE "^(FAILED|ERROR)" /tmp/gc/pytest.log | head -20
fi
if [ "$1" = B ]; then
  # B: the same machine's all-seven MLP step at four commits, from trees under abtrees/ (untracked copies made
  # here by `git archive <sha>`; the device copies them with the working tree), HEAD from the root: a1c0380
  # (main at the session's start), d643c05 (+ vc-fused, parity-floor), 7b8ec24 (+ causal's three nodes),
  # HEAD (+ vaccine's copy off the chain), then a1c0380 and HEAD again; gpu_check at <sha> (HEAD) first.
  # Predictions (session 34, before the call): call A at e020b55 measured all seven 148.1 us, none 101.5, the
  # ablation's causal row 8.7 us (unchanged from 9.0): causal's gathers and reduce were not where its cost
  # lies, so the four trees' all-seven steps lie within 3 us of each other on this machine; the difference
  # from 4eeb11d's 143.4-144.5 is the machine's (its reference step 100.9 us against 98.27 then).
  ab() { local tree=$1 tag=$2; ( cd "$tree" && PYTHONPATH=. timeout $(left 60) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all --rounds 5 --out $OUT/ab_$tag.json > /tmp/ab_$tag.log 2>&1 ); echo "$tag: $(grep -E "aux (none|all) +train step" /tmp/ab_$tag.log | awk '{print $3, $(NF-1)}' | tr '\n' ' ')"; }
  # gpu_check first (the report at the final commit matters more; it took 249 s at e020b55), then the A/B
  t gpu_check; export CUDARL_COMMIT=$2; D=$(( ${GC_S:-300} ))
  PARALLEL=6 BENCHES=tools/bench_step.py BENCH_ARGS="--no-epoch --no-dw-variants" DEADLINE_S=$D OUT=/tmp/gc BENCH_DIR=/tmp/bench bash tools/gpu_check.sh > /tmp/gc.log 2>&1
  cp docs/gpu-report.md $OUT/report.md; cp /tmp/bench/bench_step.json $OUT/ 2>/dev/null; cp /tmp/gc/pytest.log $OUT/pytest.log 2>/dev/null
  grep -E "passed|failed" /tmp/gc/pytest.log | tail -4; grep -hE "^(FAILED|ERROR)" /tmp/gc/pytest.log | head -20
  t ab; ab abtrees/a1c0380 a1c0380_1; ab . head_1; ab abtrees/d643c05 d643c05_1; ab abtrees/7b8ec24 7b8ec24_1; ab abtrees/a1c0380 a1c0380_2; ab . head_2
fi
if [ "$1" = C ]; then
  # B and C need the A/B's trees made here before the call (untracked; remove them after):
  #   for c in a1c0380 d643c05 7b8ec24; do mkdir -p abtrees/$c && git archive $c cudarl cuda_src tools pyproject.toml \
  #     setup.cfg README.md LICENSE | tar -x -C abtrees/$c; done
  # and C carries the cupti-python wheels (cupti-python 13.4.0, cuda-bindings 13.5.0, cuda-pathfinder, pyelftools
  # for CPython 3.12, `pip download --no-deps`) in .whl: run(..., carry=[".whl"]).
  # Session 34 could not run B or C (device time spent on starts that failed); C is the next session's first call.
  # C: what 262 s of device time could still hold after B's starts failed: the two trace tests of vaccine's
  # branch at <sha> (one failed at e020b55 on an assertion 749c754 made wrong), then B's A/B as time allows.
  # Predictions: as B's (the trees within 3 us of each other); both tests pass.
  t tests; PYTHONPATH=. timeout $(left 60) python3 -m pytest -m gpu -q -p no:cacheprovider tests/unit/test_aux_branches.py -k "vaccines_backward_runs_beside or vaccines_copy" > /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -5
  # the replay's own timeline (tools/profile_step.py --timeline: CUPTI's concurrent-kernel records; the wheels
  # of cupti-python carried in .whl): the all-seven MLP step, then none; predictions: the all-seven span near
  # bench_aux's 148 us, none near 101; the observed chain, read after the call, says where the 47 us go
  t cupti; ls -d /usr/local/cuda*/extras/CUPTI/lib64/libcupti.so* 2>/dev/null | head -3
  timeout 30 python3 -m pip install -q --no-deps --target /tmp/cpt .whl/*.whl > /tmp/pip.log 2>&1; tail -2 /tmp/pip.log
  ALL7="agent.aux=[horizons,risk,denoise,homeostatic,causal,selectivity,vaccine]"
  PYTHONPATH=.:/tmp/cpt timeout $(left 50) python3 tools/profile_step.py --graph train --timeline $OUT/timeline_all.json --set "$ALL7" --set "agent.causal_groups=[calendar,offset]" --set replay.capacity=100000 > /tmp/tl_all.log 2>&1; head -3 /tmp/tl_all.log; tail -3 /tmp/tl_all.log; cp /tmp/tl_all.log $OUT/
  PYTHONPATH=.:/tmp/cpt timeout $(left 40) python3 tools/profile_step.py --graph train --timeline $OUT/timeline_none.json --set replay.capacity=100000 > /tmp/tl_none.log 2>&1; head -2 /tmp/tl_none.log; cp /tmp/tl_none.log $OUT/
  PYTHONPATH=. timeout 20 python3 tools/profile_step.py --compare $OUT/timeline_none.json $OUT/timeline_all.json --out $OUT/timeline_compare.json 2>&1 | head -4
  ab() { local tree=$1 tag=$2; ( cd "$tree" && PYTHONPATH=. timeout $(left 40) python3 tools/bench_aux.py --encoder mlp --no-whole --arms all --rounds 5 --out $OUT/ab_$tag.json > /tmp/ab_$tag.log 2>&1 ); echo "$tag: $(grep -E "aux (none|all) +train step" /tmp/ab_$tag.log | awk '{print $3, $(NF-1)}' | tr '\n' ' ')"; }
  t ab; ab abtrees/a1c0380 a1c0380_1; ab . head_1; ab abtrees/d643c05 d643c05_1; ab abtrees/7b8ec24 7b8ec24_1; ab abtrees/a1c0380 a1c0380_2; ab . head_2
fi
t end
