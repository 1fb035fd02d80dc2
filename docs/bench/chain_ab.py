"""Session 30's A/B of net.gemm = "chain" against the default (cublaslt_nosplit), in one process on one GPU:
the reference train and collect steps interleaved (ABAB), the per-phase profile of both, and issue 19's
all-seven MLP step under both (docs/bench/call_s30.sh runs it; predictions in docs/perf-notes.md)."""

import os

from cudarl.bench import reference_config, step_benchmark

for rnd in range(2):
    for gemm in ("cublaslt_nosplit", "chain"):
        rows = step_benchmark(
            repeats=200, cfg=reference_config("gpu", net={"gemm": gemm}), phases=False, label=f", {gemm}"
        )
        print(rnd, gemm, "; ".join(f"{r['metric']}: {r['value']:.1f}" for r in rows if "step" in r["metric"]))
for gemm in ("cublaslt_nosplit", "chain"):
    rows = step_benchmark(repeats=200, cfg=reference_config("gpu", net={"gemm": gemm}), phases=True, label=f", {gemm}")
    print("phases", gemm, "; ".join(f"{r['metric']}: {r['value']:.1f}" for r in rows if "phase" in r["metric"]))
SEVEN = ["horizons", "risk", "denoise", "homeostatic", "causal", "selectivity", "vaccine"]
AUX = {"aux": SEVEN, "causal_groups": ["calendar", "offset"]}
for gemm in (
    () if os.environ.get("NO_AUX") else ("cublaslt_nosplit", "chain")
):  # issue 19: the MLP's all-seven step (capacity 100k as bench_aux)
    cfg = reference_config("gpu", capacity=100_000, net={"gemm": gemm}, agent=AUX)
    rows = step_benchmark(repeats=200, cfg=cfg, phases=False, label=f", all seven, {gemm}")
    print(
        "aux all seven",
        gemm,
        "; ".join(f"{r['metric']}: {r['value']:.1f}" for r in rows if "train step" in r["metric"]),
    )
