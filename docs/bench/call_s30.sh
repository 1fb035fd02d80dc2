# Session 30's device call (one start for all of it), from a checkout of main with net.gemm = "chain":
#   C: OUT=$OUT bash docs/bench/call_s30.sh C: the chain's GPU tests (tests/parity/test_gemm.py and test_nn.py,
#      -k chain: the kernel layer by layer against nn_bias_act bit for bit, the 66-column input, graphed ==
#      eager, the network under "chain" against "cudarl" bit for bit, the trainer reproducible), memcheck and
#      racecheck on the kernel's small cases, then the reference step under cublaslt_nosplit (the default)
#      and chain, interleaved (ABAB), train and collect, then the per-phase profile under both (forward and
#      backward phases: the forward chain's and the backward's dx chain's shares of the difference).
# Predictions (written before the call; docs/perf-notes.md, thirtieth session): the forward chain alone, train
# 80-88 us against 95-102 under cublaslt_nosplit; with the backward's dx chain (merged before the call, branch
# chain-bwd) a further 8-15 us: train 65-80 us under chain; collect 55-65 against 76-80. Issue 19's all-seven
# MLP step (the chain's backward adding the Q head's dL/dpsi to the signals' when they ran first): 25-40 us
# shorter under chain than under cublaslt_nosplit (about 200 us), the none-arm 20-30 us shorter.
R=$(pwd); T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-580} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = C ]; then
  t tests; PYTHONPATH=. timeout $(left 240) python3 -m pytest -q -p no:cacheprovider -rf tests/parity/test_gemm.py tests/parity/test_nn.py -k "chain or gemm_graphed or nn_bias_act" > /tmp/t.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" /tmp/t.log | head -30; cp /tmp/t.log $OUT/tests.log
  KS="chain and not 4096 and not 512x"
  for tool in memcheck racecheck; do
    t $tool; PYTHONPATH=. timeout $(left 90) compute-sanitizer --tool $tool --print-limit 3 python3 -m pytest -m gpu -q -p no:cacheprovider tests/parity/test_gemm.py -k "$KS" 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|hazard|passed|failed" | tail -4
  done
  t bench; PYTHONPATH=. timeout $(left 260) python3 - <<'PY' 2>&1 | tail -12
from cudarl.bench import reference_config, step_benchmark
for rnd in range(2):
    for gemm in ("cublaslt_nosplit", "chain"):
        rows = step_benchmark(repeats=200, cfg=reference_config("gpu", net={"gemm": gemm}), phases=False, label=f", {gemm}")
        print(rnd, gemm, "; ".join(f"{r['metric']}: {r['value']:.1f}" for r in rows if "step" in r["metric"]))
for gemm in ("cublaslt_nosplit", "chain"):
    rows = step_benchmark(repeats=200, cfg=reference_config("gpu", net={"gemm": gemm}), phases=True, label=f", {gemm}")
    print("phases", gemm, "; ".join(f"{r['metric']}: {r['value']:.1f}" for r in rows if "phase" in r["metric"]))
AUX = {"aux": ["horizons", "risk", "denoise", "homeostatic", "causal", "selectivity", "vaccine"], "causal_groups": ["calendar", "offset"]}
for gemm in ("cublaslt_nosplit", "chain"):  # issue 19: the MLP's all-seven step (capacity 100k as bench_aux)
    cfg = reference_config("gpu", capacity=100_000, net={"gemm": gemm}, agent=AUX)
    rows = step_benchmark(repeats=200, cfg=cfg, phases=False, label=f", all seven, {gemm}")
    print("aux all seven", gemm, "; ".join(f"{r['metric']}: {r['value']:.1f}" for r in rows if "train step" in r["metric"]))
PY
fi
t end
