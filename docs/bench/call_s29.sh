# Session 29's device call (one start for all of it), from a checkout of main with branch drelu merged. Ran once,
# at 3093831 on an H100 (docs/bench/gpu-89eb67b/README.md: the step's A/B failed on the branch's missing plan):
#   A: OUT=$OUT bash docs/bench/call_s29.sh A <sha>: gpu_check at <sha> (the report of record, the drelu branch's
#      GPU tests among every other; few files back), then lt_drelu_probe (does cuBLASLt offer FP32
#      RELU_AUX_BIAS / DRELU for the reference shapes, and at what cost), then the reference step under
#      cublaslt_nosplit (the default) and cublaslt_drelu, interleaved (ABAB), train and collect.
# Predictions (written before the call; docs/perf-notes.md, twenty-ninth session): the probe offers FP32
# algorithms for all three epilogues with the same tile as the plain GEMM; the reference train step 3-6 us
# shorter under cublaslt_drelu (two ReLU kernels, about 2 us each, off the backward's chain: the encoder's and
# the one below the C51 head; the forwards' mask writes cost well under 1 us); collect unchanged within 1 us.
R=$(pwd); T0=$(date +%s); t() { echo "== $1 t=$(( $(date +%s) - T0 ))"; }
left() { local l=$(( ${LIMIT:-580} - ($(date +%s) - T0) )); [ "$l" -lt 1 ] && l=1; [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }
nvidia-smi --query-gpu=name --format=csv,noheader
if [ "$1" = A ]; then
  t gpu_check; OUT=$OUT bash docs/bench/gpu_s25.sh G "$2" 2>&1 | tail -12
  t probe; PYTHONPATH=. timeout $(left 60) python3 docs/bench/lt_drelu_probe.py --out $OUT/lt_drelu.json 2>&1 | tail -18
  t bench; PYTHONPATH=. timeout $(left 150) python3 - <<'PY' 2>&1 | tail -8
from cudarl.bench import reference_config, step_benchmark
for rnd in range(2):
    for gemm in ("cublaslt_nosplit", "cublaslt_drelu"):
        rows = step_benchmark(repeats=200, cfg=reference_config("gpu", net={"gemm": gemm}), phases=False, label=f", {gemm}")
        print(rnd, gemm, "; ".join(f"{r['metric']}: {r['value']:.1f}" for r in rows if "step" in r["metric"]))
PY
  grep -E "drelu|mask" /tmp/gc/pytest.log | grep -E "FAILED|ERROR" | head
fi
t end
