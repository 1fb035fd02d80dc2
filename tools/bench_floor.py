#!/usr/bin/env python3
"""The floor model's constants on this GPU: what a graph node costs when it has no work, alone, in a
chain and on parallel branches, and what launching a graph and a kernel costs (issue 20).

Every probe is a CUDA graph captured from ``cudarl_testing_empty`` (a kernel that does nothing) or
``cudarl_testing_axpb`` (x = a x + b, 8 bytes a float), replayed and timed with CUDA events
(median of ``--repeats``):

* chain: N empty nodes one after the other (N = 1 .. 256); the least-squares line through
  (N, replay time) gives the marginal cost of a node on a dependency chain (its slope) and the
  graph's own launch and tail (its intercept);
* branches: N empty nodes on N parallel branches (fork from one node, join into one): what the
  same N nodes cost when they need not wait for each other;
* grid: one empty node of 1 .. 8448 blocks of 256 threads: what dispatching blocks costs;
* bytes: a chain of 8 axpb nodes over 16 KB .. 128 MB: a node's time against the bytes it moves,
  L2-resident and not (the round trip through memory between two nodes);
* FP32: two million dependent chains of FMAs (x = a x + b), the rate the critical path's FLOPs are
  divided by;
* launch: a one-node graph of the tiny kernel; an eager empty launch back to back (GPU time per
  launch); an eager launch and host synchronisation (host wall time).

``docs/perf-notes.md`` (the floor model) and ``tools/critical_path.py`` (``--floor``) read the
JSON's ``model`` block. Usage: python tools/bench_floor.py [--repeats 200] [--out PATH]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from benchlib import cuda_time_us, parser, report, row, skipped_without_gpu  # noqa: E402

CHAIN = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BRANCHES = (2, 4, 8, 16, 32, 64)
GRIDS = (1, 132, 1056, 8448)
AXPB_FLOATS = (4096, 65536, 1 << 20, 1 << 22, 1 << 25)  # 16 KB .. 128 MB
AXPB_CHAIN = 8
FMA_FLOATS, FMA_ITERS = 1 << 21, 4096  # 2M chains (16 a thread slot of an H200's 132 SMs), 17 GFLOP


def fit_line(xs, ys) -> tuple[float, float]:
    """Least-squares ``y = slope * x + intercept``."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(slope), float(intercept)


class Prober:
    """Captures small graphs on one stream, each under a kernel context of its own."""

    def __init__(self, repeats: int):
        import cupy

        self.cp = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.sides = [cupy.cuda.Stream(non_blocking=True) for _ in range(max(BRANCHES))]
        self.repeats = repeats
        self._n = 0

    def capture(self, body):
        from cudarl import kernels

        self._n += 1
        mode = getattr(self.cp.cuda.runtime, "streamCaptureModeThreadLocal", 1)
        with self.stream, kernels.use_context(f"floor_{self._n}"):
            self.stream.begin_capture(mode)
            try:
                body()
            finally:
                graph = self.stream.end_capture()
        return graph

    def time(self, graph) -> float:
        return cuda_time_us(lambda: graph.launch(self.stream), self.stream, self.repeats)

    def fork_join(self, bodies) -> None:
        """Each body on a side stream of its own, after what the main stream enqueued; the main
        stream then waits for all of them (parallel branches of the captured graph)."""
        Event = self.cp.cuda.Event
        forked = Event(disable_timing=True)
        forked.record(self.stream)
        done = []
        for side, body in zip(self.sides, bodies, strict=False):
            side.wait_event(forked)
            with side:
                body()
            e = Event(disable_timing=True)
            e.record(side)
            done.append(e)
        for e in done:
            self.stream.wait_event(e)


def main() -> int:
    ap = parser(__doc__.splitlines()[0])
    args = ap.parse_args()
    if skipped_without_gpu("bench_floor", "floor", args.out):
        return 0
    from cudarl import kernels
    from cudarl.ops import testing

    kernels.prefetch(["testing"])
    p = Prober(args.repeats)
    cp = p.cp
    rows, model = [], {}

    # chain of N empty nodes
    chain = {}
    for n in CHAIN:
        chain[n] = p.time(p.capture(lambda n=n: [testing.empty() for _ in range(n)]))
        rows.append(row("chain of N empty nodes", f"N = {n}, replay", chain[n], "us"))
    slope, intercept = fit_line(list(chain), list(chain.values()))
    model["node_us"], model["graph_launch_us"] = slope, intercept
    rows.append(row("chain of N empty nodes", "marginal cost of a node (slope)", slope, "us"))
    rows.append(row("chain of N empty nodes", "graph launch and tail (intercept)", intercept, "us"))

    # N parallel branches of one empty node, between one fork node and one join node
    branches = {}
    for n in BRANCHES:
        graph = p.capture(
            lambda n=n: (testing.empty(), p.fork_join([testing.empty] * n), testing.empty())  # fork, N, join
        )
        branches[n] = p.time(graph)
        rows.append(row("N parallel empty branches", f"N = {n} (+2 nodes: fork, join), replay", branches[n], "us"))
        rows.append(
            row("N parallel empty branches", f"N = {n}, same N + 2 nodes as a chain", chain_time(p, n + 2), "us")
        )
    b_slope, b_intercept = fit_line(list(branches), list(branches.values()))
    model["branch_us"] = b_slope
    rows.append(row("N parallel empty branches", "marginal cost of a branch (slope)", b_slope, "us"))

    # one empty node on a growing grid
    grid = {}
    for blocks in GRIDS:
        grid[blocks] = p.time(p.capture(lambda b=blocks: testing.empty(b, 256)))
        rows.append(row("one empty node, blocks of 256 threads", f"{blocks} blocks, replay", grid[blocks], "us"))
    model["grid_us"] = {str(k): v for k, v in grid.items()}

    # bytes: a chain of axpb nodes (reads and writes 8 bytes a float)
    per_node = {}
    for n in AXPB_FLOATS:
        x = cp.ones(n, np.float32)
        t = p.time(p.capture(lambda x=x: [testing.axpb(x, 1.0, 0.0) for _ in range(AXPB_CHAIN)]))
        per_node[n] = t / AXPB_CHAIN
        mb = 8 * n / 1e6
        rows.append(row(f"chain of {AXPB_CHAIN} axpb nodes", f"{mb:g} MB moved a node: time a node", per_node[n], "us"))
        rows.append(
            row(
                f"chain of {AXPB_CHAIN} axpb nodes",
                f"{mb:g} MB moved a node: bandwidth",
                8 * n / per_node[n] / 1e3,
                "GB/s",
            )
        )
        del x
    model["axpb_node_us"] = {str(8 * k): v for k, v in per_node.items()}
    big = max(AXPB_FLOATS)
    model["memory_gbps"] = 8 * big / per_node[big] / 1e3

    # FP32 rate: a million-thread chain of FMAs (2 FLOPs each), eager
    chains = cp.ones(FMA_FLOATS, np.float32)
    with p.stream:
        t = cuda_time_us(lambda: testing.fma(chains, 0.999, 1e-3, FMA_ITERS), p.stream, max(5, args.repeats // 10))
    model["fp32_tflops"] = 2.0 * FMA_FLOATS * FMA_ITERS / t / 1e6
    rows.append(row("FP32 rate", f"{FMA_FLOATS} chains of {FMA_ITERS} FMAs", t, "us"))
    rows.append(row("FP32 rate", "achieved", model["fp32_tflops"], "TFLOP/s"))

    # launch costs
    tiny = cp.ones(1024, np.float32)
    one_tiny = p.time(p.capture(lambda: testing.axpb(tiny, 1.0, 0.0)))
    rows.append(row("launch", "graph of 1 node, tiny kernel (axpb, 1024 floats), replay", one_tiny, "us"))
    model["one_node_graph_us"] = one_tiny
    with p.stream:
        eager = cuda_time_us(lambda: testing.empty(), p.stream, args.repeats, inner=100)
    rows.append(row("launch", "eager empty kernel, back to back (GPU time per launch)", eager, "us"))
    model["eager_launch_us"] = eager
    ts = []
    with p.stream:
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            testing.empty()
            p.stream.synchronize()
            ts.append((time.perf_counter() - t0) * 1e6)
    rows.append(row("launch", "eager empty kernel + stream synchronise (host wall)", statistics.median(ts), "us"))
    model["launch_sync_us"] = statistics.median(ts)
    report("bench_floor", rows, args.out, {"model": model, "repeats": args.repeats})
    return 0


def chain_time(p: Prober, n: int) -> float:
    from cudarl.ops import testing

    return p.time(p.capture(lambda: [testing.empty() for _ in range(n)]))


if __name__ == "__main__":
    sys.exit(main())
