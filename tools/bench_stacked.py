#!/usr/bin/env python3
"""The stacked network (issue 23, stage 2): P members' forward + backward in one graph against P single
networks in one graph, and what the per-member weight gradients cost.

The reference network (66 inputs: 64 features + 2 of position; MLP 256-256; dueling C51, 51 atoms, 3
actions; batch 512 rows a member). For each P in ``--sizes`` (default 1, 8, 64), each arm is captured in
one CUDA graph and timed as the median of ``--repeats`` replays (CUDA events):

* ``stacked``: ``StackedQNetwork.forward`` + the output gradient copied in + ``backward`` (batched cuBLASLt
  forwards and dx, the member-axis kernels, dW as P cuBLAS split-K GEMMs per layer);
* ``singles``: the same for P ``QNetwork``s one after another;
* ``dW per member``: the stacked backward's weight gradients alone (P x 3 cuBLAS GEMMs, the single agent's);
* ``dW batched``: the same gradients as 3 one-kernel strided-batched cuBLASLt GEMMs (``gemm_lt_batched``,
  ``trans_a``), what the stacked backward runs under ``net.dw_gemm = "one_kernel"`` (the single agent's
  dW then a one-kernel cuBLASLt GEMM too).

The last two price the ``net.dw_gemm`` choice of docs/perf-notes.md ("The agent axis, in stages"), with the
single step's time under each (``tools/bench_step.py``'s ``net.dw_gemm=one_kernel`` case). Prints a
table, writes JSON (``--out``, default ``docs/bench/bench_stacked.json``); without a usable CuPy and GPU it
prints why and skips.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from benchlib import cuda_time_us, fp32_peak_tflops, parser, report, row, skipped_without_gpu  # noqa: E402

N_IN, N_ACTIONS, BATCH = 66, 3, 512
NET = {"hidden": (256, 256), "atoms": 51}
SIZES = (1, 8, 64)


def _graph_us(name: str, fn, repeats: int) -> float:
    """Median microseconds of one replay of ``fn`` captured alone (after one eager run)."""
    import cupy as cp

    from cudarl.graph import StepGraph

    g = StepGraph(name, [("step", fn)], xp=cp)
    g.run_eager()
    g.synchronize()
    g.capture()
    return cuda_time_us(g.replay, g.stream, repeats)


def _flops(P: int) -> float:
    """FLOPs of P members' forward + backward: every GEMM twice (forward, dW) and dx for all but the first."""
    dims = [N_IN, *NET["hidden"], (1 + N_ACTIONS) * NET["atoms"]]
    macs = [a * b for a, b in zip(dims[:-1], dims[1:], strict=True)]
    return 2.0 * P * BATCH * (2 * sum(macs) + sum(macs[1:]))


def _weight_gradients(stacked) -> list:
    """``(input rows, output-gradient rows, gradient view)`` ``[P, B, n_in]``, ``[P, B, n_out]``,
    ``[P, n_in, n_out]`` of each layer's dW in the stacked network's default workspace."""
    layers = stacked.layer_rows(stacked.ws, stacked.input())
    return [(x, stacked.ws.rows(f"{lin.name}.dout", BATCH), stacked.G[f"{lin.name}.weight"]) for lin, x, _ in layers]


def rows_for(P: int, repeats: int, rng) -> tuple[list[dict], dict]:
    import cupy as cp

    from cudarl import blas
    from cudarl.nn import QNetwork, StackedQNetwork
    from cudarl.nn.params import matmul

    stacked = StackedQNetwork(N_IN, N_ACTIONS, members=P, xp=cp, max_batch=BATCH, **NET)
    singles = [QNetwork(N_IN, N_ACTIONS, xp=cp, max_batch=BATCH, seed=i, **NET) for i in range(P)]
    x = stacked.input()
    x[...] = cp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    g = cp.asarray(rng.standard_normal((P, BATCH, N_ACTIONS, NET["atoms"])).astype(np.float32))

    def stacked_step():
        stacked.forward(x)
        cp.copyto(stacked.grad_output(), g)
        stacked.backward()

    xs = [x[i].copy() for i in range(P)]

    def singles_step():
        for i, net in enumerate(singles):
            net.forward(xs[i])
            cp.copyto(net.grad_outputs()["q"], g[i])
            net.backward()

    dws = _weight_gradients(stacked)

    def dw_per_member():
        for a, dy, gw in dws:
            for i in range(P):
                matmul(a[i], dy[i], gw[i], trans_a=True)

    def dw_batched():
        for a, dy, gw in dws:
            blas.gemm_lt_batched(a, dy, gw, trans_a=True)

    t = {
        "stacked": _graph_us(f"bench_stacked_{P}", stacked_step, repeats),
        "singles": _graph_us(f"bench_stacked_singles_{P}", singles_step, repeats),
        "dw_per_member": _graph_us(f"bench_stacked_dw_{P}", dw_per_member, repeats),
        "dw_batched": _graph_us(f"bench_stacked_dw_batched_{P}", dw_batched, repeats),
    }
    flops = _flops(P)
    case = f"P={P} (batch {BATCH}, 66-256-256-204)"
    rows = [
        row(case, "stacked forward + backward, one graph", t["stacked"], "us"),
        row(case, f"{P} single networks, one graph", t["singles"], "us"),
        row(case, "stacked speed-up", t["singles"] / t["stacked"], "x"),
        row(case, "stacked: fraction of FP32 peak", flops / (t["stacked"] * 1e-6) / (fp32_peak_tflops() * 1e12), ""),
        row(case, "dW per member (cuBLAS split-K), alone", t["dw_per_member"], "us"),
        row(case, "dW batched (one-kernel cuBLASLt), alone", t["dw_batched"], "us"),
    ]
    return rows, {case: {**{f"{k}_us": v for k, v in t.items()}, "flop": flops}}


def main() -> int:
    ap = parser(__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="members P (comma-separated)")
    args = ap.parse_args()
    if skipped_without_gpu("bench_stacked", "stacked", args.out):
        return 0
    rng = np.random.default_rng(1)
    rows, extra = [], {"fp32_peak_tflops": fp32_peak_tflops()}
    for P in (int(s) for s in args.sizes.split(",")):
        more, more_extra = rows_for(P, args.repeats, rng)
        rows += more
        extra.update(more_extra)
    report("bench_stacked", rows, args.out, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
