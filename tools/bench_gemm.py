#!/usr/bin/env python3
"""The network's GEMM shapes: cuBLASLt (one-kernel algorithms, net.gemm = cublaslt_nosplit) against
the panel GEMMs of cuda_src/gemm.cu (net.gemm = cudarl).

Shapes of the reference step (DESIGN.md): forwards of 512 and 1024 rows (256 -> 256 and 256 -> 204),
the dx GEMMs of the backward (dz W^T at 512 rows), and the acting forward of 4096 rows (256 -> 256).
Every forward shape is timed with the bias and ReLU epilogue, the 256 -> 204 ones too (in the
network that layer, the C51 head's, has bias and no ReLU). Each arm is 20 launches captured in one
CUDA graph; the time is the median per launch of ``--repeats`` replays (CUDA events). Prints a
table, writes JSON (``--out``, default ``docs/bench/bench_gemm.json``). Without a usable CuPy and
GPU it prints why and skips, writing the skip only to an explicit ``--out`` (the default file keeps
its measurements).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from benchlib import cuda_time_us, parser, report, row, skipped_without_gpu  # noqa: E402

#: (kind, M, N, K): nn = act(a @ b + bias), nt = a @ bt^T
SHAPES = [
    ("nn", 512, 256, 256),
    ("nn", 1024, 256, 256),
    ("nn", 512, 204, 256),
    ("nn", 1024, 204, 256),
    ("nt", 512, 256, 204),
    ("nt", 512, 256, 256),
    ("nn", 4096, 256, 256),
]
INNER = 20


def _graph_time(name: str, fn, repeats: int) -> float:
    import cupy as cp

    from cudarl.graph import StepGraph

    g = StepGraph(name, [("gemm", lambda: [fn() for _ in range(INNER)])], xp=cp)
    g.run_eager()
    g.synchronize()
    g.capture()
    return cuda_time_us(g.replay, g.stream, repeats) / INNER


def main() -> int:
    ap = parser(__doc__.splitlines()[0])
    args = ap.parse_args()
    if skipped_without_gpu("bench_gemm", "gemm", args.out):
        return 0
    import cupy as cp

    from cudarl import blas
    from cudarl.ops import gemm as panel

    rng = np.random.default_rng(0)
    rows, extra = [], {"inner": INNER}  # report() records the GPU as "device"
    for kind, M, N, K in SHAPES:
        a = cp.asarray(rng.standard_normal((M, K)).astype(np.float32))
        b = cp.asarray((rng.standard_normal((N, K) if kind == "nt" else (K, N)) / np.sqrt(K)).astype(np.float32))
        bias = cp.asarray(rng.standard_normal(N).astype(np.float32))
        out_lt, out_p = cp.empty((M, N), np.float32), cp.empty((M, N), np.float32)
        if kind == "nn":
            blas.gemm_lt_prepare(M, N, K, bias=bias, act="relu", split_k=False)

            def lt(a=a, b=b, out_lt=out_lt, bias=bias):
                blas.gemm_lt(a, b, out_lt, bias=bias, act="relu", split_k=False)

            def pn(a=a, b=b, bias=bias, out_p=out_p):
                panel.nn_bias_act(a, b, bias, out_p, 1)
        else:
            blas.gemm_lt_prepare(M, N, K, trans_b=True, split_k=False)

            def lt(a=a, b=b, out_lt=out_lt):
                blas.gemm_lt(a, b, out_lt, trans_b=True, split_k=False)

            def pn(a=a, b=b, out_p=out_p):
                panel.nt(a, b, out_p)

        case = f"{kind} {M}x{N}x{K}"
        tag = f"bench_gemm_{kind}_{M}_{N}_{K}"
        t_lt, t_p = _graph_time(tag + "_lt", lt, args.repeats), _graph_time(tag + "_panel", pn, args.repeats)
        err = float(cp.abs(out_lt - out_p).max() / max(float(cp.abs(out_lt).max()), 1e-30))
        rows += [
            row(case, "cuBLASLt one-kernel", t_lt, "us"),
            row(case, "panel (cuda_src/gemm.cu)", t_p, "us"),
            row(case, "panel speed-up", t_lt / t_p, "x"),
            row(case, "max rel. difference", err, ""),
        ]
        extra[case] = {"cublaslt_us": t_lt, "panel_us": t_p}
    report("bench_gemm", rows, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
