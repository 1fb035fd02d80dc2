#!/usr/bin/env python3
"""The network's GEMM shapes: cuBLASLt (one-kernel algorithms, net.gemm = cublaslt_nosplit) against
the panel GEMMs of cuda_src/gemm.cu (net.gemm = cudarl).

Shapes of the reference step (DESIGN.md): forwards of 512 and 1024 rows (256 -> 256 and 256 -> 204),
the dx GEMMs of the backward (dz W^T at 512 rows), the acting forward of 4096 rows (256 -> 256), and the
forwards and dx GEMMs of the denoise and causal passes over 64 rows (``agent.aux_gemm``). Beside the
one-kernel cuBLASLt arm and the panel arm, cuBLASLt free to split K (``net.gemm = "cublaslt"``).
Every forward shape is timed with the bias and ReLU epilogue, the 256 -> 204 ones too (in the
network that layer, the C51 head's, has bias and no ReLU). Each arm is 20 launches captured in one
CUDA graph; the time is the median per launch of ``--repeats`` replays (CUDA events).

The batched arm (issue 23's agent axis): every GEMM of the reference train step (the forwards with
their epilogues, the backward's dx and dW) for P = 1, 8, 64 members (``--sizes``), timed as one
strided-batched cuBLASLt GEMM (``blas.gemm_lt_batched``) and as P single ``gemm_lt`` calls one after
another in one graph (both one-kernel algorithms, members' operands stacked as a population's), with
the ratio, the fraction of the FP32 peak the batch reaches, and whether every entry of the batch equals
its single GEMM bit for bit. ``--arms`` picks ``panel``, ``batched`` or both.

Prints a table, writes JSON (``--out``, default ``docs/bench/bench_gemm.json``, or
``docs/bench/bench_gemm_batched.json`` for ``--arms batched``). Without a usable CuPy
and GPU it prints why and skips, writing the skip only to an explicit ``--out`` (the default file
keeps its measurements).
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
    # the denoise and causal passes over the sub-batch (agent.aux_rows: 64 of the reference's 512 rows)
    ("nn", 64, 256, 256),
    ("nn", 64, 204, 256),
    ("nt", 64, 256, 256),
    ("nt", 64, 256, 204),
]
INNER = 20

#: The GEMMs of the reference train step as gemm_lt takes them (the batched arm):
#: (name, M, N, K, trans_a, trans_b, act, bias); the observation has 66 columns (64 features, 2 of position)
STEP_GEMMS = [
    ("fwd 64->256", 512, 256, 64, False, False, "relu", True),
    ("fwd 66->256", 512, 256, 66, False, False, "relu", True),
    ("fwd 256->256", 512, 256, 256, False, False, "relu", True),
    ("fwd 256->204", 512, 204, 256, False, False, "identity", True),
    ("dx 256<-256", 512, 256, 256, False, True, "identity", False),
    ("dx 256<-204", 512, 256, 204, False, True, "identity", False),
    ("dW 64x256", 64, 256, 512, True, False, "identity", False),
    ("dW 66x256", 66, 256, 512, True, False, "identity", False),
    ("dW 256x256", 256, 256, 512, True, False, "identity", False),
    ("dW 256x204", 256, 204, 512, True, False, "identity", False),
]
SIZES = (1, 8, 64)
#: a member's bias starts 64 floats (256 bytes) after the previous one's, as stacked parameters would
BIAS_STRIDE = 64


def _graph_time(name: str, fn, repeats: int) -> float:
    import cupy as cp

    from cudarl.graph import StepGraph

    g = StepGraph(name, [("gemm", lambda: [fn() for _ in range(INNER)])], xp=cp)
    g.run_eager()
    g.synchronize()
    g.capture()
    return cuda_time_us(g.replay, g.stream, repeats) / INNER


def batched_operands(xp, rng, P: int, M: int, N: int, K: int, trans_a: bool, trans_b: bool, bias: bool):
    """Stacked members' operands of one step GEMM: a ``[P, M, K]`` (``[P, K, M]``), b ``[P, K, N]``
    (``[P, N, K]``), the bias ``[P, N]`` entries :data:`BIAS_STRIDE` floats apart (or None), and two
    outputs ``[P, M, N]`` (the batch's and the singles')."""
    a = xp.asarray(rng.standard_normal((P, K, M) if trans_a else (P, M, K)).astype(np.float32))
    b = xp.asarray((rng.standard_normal((P, N, K) if trans_b else (P, K, N)) / np.sqrt(K)).astype(np.float32))
    stride = -(-N // BIAS_STRIDE) * BIAS_STRIDE
    biases = xp.asarray(rng.standard_normal((P, stride)).astype(np.float32))[:, :N] if bias else None
    return a, b, biases, xp.empty((P, M, N), np.float32), xp.empty((P, M, N), np.float32)


def batched_rows(sizes, repeats: int) -> tuple[list[dict], dict]:
    """The batched arm's rows and JSON entries (GPU)."""
    import cupy as cp
    from benchlib import fp32_peak_tflops

    from cudarl import blas

    rng = np.random.default_rng(1)
    peak = fp32_peak_tflops()
    rows, extra = [], {}
    for name, M, N, K, ta, tb, act, has_bias in STEP_GEMMS:
        for P in sizes:
            a, b, bias, out_b, out_s = batched_operands(cp, rng, P, M, N, K, ta, tb, has_bias)
            kw = dict(act=act, trans_a=ta, trans_b=tb)

            def batched(a=a, b=b, bias=bias, out=out_b, kw=kw):
                blas.gemm_lt_batched(a, b, out, bias=bias, **kw)

            def singles(a=a, b=b, bias=bias, out=out_s, kw=kw, P=P):
                for i in range(P):
                    blas.gemm_lt(a[i], b[i], out[i], bias=None if bias is None else bias[i], split_k=False, **kw)

            batched()  # plans (the single GEMM's first), outside any capture
            singles()
            tag = f"bench_gemm_batched_{name.replace(' ', '_').replace('>', '').replace('<', '')}_{P}"
            t_b, t_s = _graph_time(tag, batched, repeats), _graph_time(tag + "_singles", singles, repeats)
            flops = 2.0 * P * M * N * K
            nbytes = 4 * P * (M * K + K * N + M * N + (N if has_bias else 0))
            case = f"{name} ({M}x{N}x{K}) P={P}"
            same = bool((out_b == out_s).all())  # NaN-free: both written from finite operands
            rows += [
                row(case, "one strided-batched GEMM", t_b, "us"),
                row(case, f"{P} single GEMMs in one graph", t_s, "us"),
                row(case, "batched speed-up", t_s / t_b, "x"),
                row(case, "batched: fraction of FP32 peak", flops / (t_b * 1e-6) / (peak * 1e12), ""),
                row(case, "entries == single GEMMs, bitwise", same, ""),
            ]
            extra[case] = {"batched_us": t_b, "singles_us": t_s, "flop": flops, "bytes": nbytes, "bitwise": same}
    extra["fp32_peak_tflops"] = peak
    return rows, extra


def main() -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--arms", choices=("panel", "batched", "all"), default="all", help="which arms to run")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="members P of the batched arm (comma-separated)")
    args = ap.parse_args()
    if skipped_without_gpu("bench_gemm", "gemm", args.out):
        return 0
    rows, extra = [], {"inner": INNER}  # report() records the GPU as "device"
    if args.arms in ("panel", "all"):
        rows += panel_rows(args.repeats, extra)
    if args.arms in ("batched", "all"):
        more, batched_extra = batched_rows([int(x) for x in args.sizes.split(",")], args.repeats)
        rows += more
        extra["batched"] = batched_extra
    # the batched arm alone gets a file of its own: the default bench_gemm.json keeps the panel arm's numbers
    report("bench_gemm_batched" if args.arms == "batched" else "bench_gemm", rows, args.out, extra)
    return 0


def panel_rows(repeats: int, extra: dict) -> list[dict]:
    """The cuBLASLt-against-panel arm's rows (GPU); its JSON entries go into ``extra``."""
    import cupy as cp

    from cudarl import blas
    from cudarl.ops import gemm as panel

    rng = np.random.default_rng(0)
    rows = []
    for kind, M, N, K in SHAPES:
        a = cp.asarray(rng.standard_normal((M, K)).astype(np.float32))
        b = cp.asarray((rng.standard_normal((N, K) if kind == "nt" else (K, N)) / np.sqrt(K)).astype(np.float32))
        bias = cp.asarray(rng.standard_normal(N).astype(np.float32))
        out_lt, out_p = cp.empty((M, N), np.float32), cp.empty((M, N), np.float32)
        out_sk = cp.empty((M, N), np.float32)
        if kind == "nn":
            blas.gemm_lt_prepare(M, N, K, bias=bias, act="relu", split_k=False)
            blas.gemm_lt_prepare(M, N, K, bias=bias, act="relu", split_k=True)

            def lt(a=a, b=b, out_lt=out_lt, bias=bias):
                blas.gemm_lt(a, b, out_lt, bias=bias, act="relu", split_k=False)

            def sk(a=a, b=b, out_sk=out_sk, bias=bias):
                blas.gemm_lt(a, b, out_sk, bias=bias, act="relu", split_k=True)

            def pn(a=a, b=b, bias=bias, out_p=out_p):
                panel.nn_bias_act(a, b, bias, out_p, 1)
        else:
            blas.gemm_lt_prepare(M, N, K, trans_b=True, split_k=False)
            blas.gemm_lt_prepare(M, N, K, trans_b=True, split_k=True)

            def lt(a=a, b=b, out_lt=out_lt):
                blas.gemm_lt(a, b, out_lt, trans_b=True, split_k=False)

            def sk(a=a, b=b, out_sk=out_sk):
                blas.gemm_lt(a, b, out_sk, trans_b=True, split_k=True)

            def pn(a=a, b=b, out_p=out_p):
                panel.nt(a, b, out_p)

        case = f"{kind} {M}x{N}x{K}"
        tag = f"bench_gemm_{kind}_{M}_{N}_{K}"
        t_lt, t_p = _graph_time(tag + "_lt", lt, repeats), _graph_time(tag + "_panel", pn, repeats)
        t_sk = _graph_time(tag + "_splitk", sk, repeats)
        err = float(cp.abs(out_lt - out_p).max() / max(float(cp.abs(out_lt).max()), 1e-30))
        rows += [
            row(case, "cuBLASLt one-kernel", t_lt, "us"),
            row(case, "cuBLASLt, split-K allowed", t_sk, "us"),
            row(case, "panel (cuda_src/gemm.cu)", t_p, "us"),
            row(case, "panel speed-up", t_lt / t_p, "x"),
            row(case, "max rel. difference", err, ""),
        ]
        extra[case] = {"cublaslt_us": t_lt, "cublaslt_split_k_us": t_sk, "panel_us": t_p}
    return rows


if __name__ == "__main__":
    sys.exit(main())
