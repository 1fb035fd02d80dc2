#!/usr/bin/env python3
"""Graph replay against eager launches: 100 small kernels; 20 GEMMs (cupy.matmul vs captured cuBLAS)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from benchlib import cuda_time_us, parser, report, row  # noqa: E402


def main() -> int:
    args = parser(__doc__).parse_args()
    import cupy as cp

    from cudarl import blas
    from cudarl.graph import StepGraph
    from cudarl.ops import testing

    rows = []
    x = cp.ones(1024, np.float32)
    phases = [(f"k{i}", lambda: testing.axpb(x, 1.0, 0.0)) for i in range(100)]
    g = StepGraph("bench_small", phases)
    g.capture()
    eager = cuda_time_us(g.run_eager, g.stream, args.repeats)
    replay = cuda_time_us(g.replay, g.stream, args.repeats)
    rows += [
        row("100 small kernels", "eager", eager, "us"),
        row("100 small kernels", "graph replay", replay, "us"),
        row("100 small kernels", "speed-up", eager / replay, "x"),
    ]

    rng = np.random.default_rng(0)
    a = [cp.asarray(rng.standard_normal((512, 256)).astype(np.float32)) for _ in range(20)]
    b = [cp.asarray(rng.standard_normal((256, 256)).astype(np.float32)) for _ in range(20)]
    c = [cp.empty((512, 256), np.float32) for _ in range(20)]

    def mm_eager():
        for i in range(20):
            cp.matmul(a[i], b[i], out=c[i])

    def mm_blas():
        for i in range(20):
            blas.gemm(a[i], b[i], c[i])

    s = cp.cuda.Stream(non_blocking=True)
    with s:
        t_cupy = cuda_time_us(mm_eager, s, args.repeats)
    gg = StepGraph("bench_gemm", [("gemms", mm_blas)], stream=s)
    with s:
        t_blas_eager = cuda_time_us(mm_blas, s, args.repeats)
    gg.capture()
    t_replay = cuda_time_us(gg.replay, s, args.repeats)
    gemm_case = "20 GEMMs 512x256x256 fp32"
    rows += [
        row(gemm_case, "cupy.matmul eager", t_cupy, "us"),
        row(gemm_case, "cudarl.blas eager", t_blas_eager, "us"),
        row(gemm_case, "cudarl.blas graph replay", t_replay, "us"),
        row(gemm_case, "speed-up vs cupy.matmul", t_cupy / t_replay, "x"),
    ]
    report("bench_graph", rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
