#!/usr/bin/env python3
"""The critical path of a captured step, with the time, bytes and FLOPs of every node on it (the
floor model of issue 20, docs/perf-notes.md).

Inputs, all made by other tools on the GPU host:

* ``--trace trace.json``: ``tools/profile_step.py --graph train --trace trace.json``, the graph's
  launches in capture order with their streams, its phases, and the side-stream forks and joins
  (``cudarl.kernels.tracing``). The graph's edges follow from it: a launch depends on the one before
  it on its stream, a fork's first launch on the forking stream's last, a join's next launch on the
  joined stream's last.
* ``--ncu train.csv``: the ncu CSV of one replay (``tools/gpu_profile.sh``, ``profile_step.METRICS``):
  each kernel's time (alone, serialised), DRAM bytes and FP32 FLOPs (2 FFMA + FADD + FMUL). cudarl's
  kernels are matched by name (the k-th launch of a name to the k-th row of it); the other rows are
  library kernels (a split-K reduction row joins the GEMM before it), paired with the library calls by
  their FP32 FLOPs and, between calls of one shape, their order (:func:`align_library`): ncu's order is not
  the capture order across streams, and a profile may hold a kernel group no traced call made.
* ``--floor bench_floor.json``: ``tools/bench_floor.py``'s model: ``node_us`` (an empty node on a
  chain), ``memory_gbps`` and ``fp32_tflops`` (achieved rates).

Printed (and written with ``--out``): the longest path through the graph weighted by kernel time,
node by node (phase, kernel, us, bytes, FLOPs, and the node's floor ``max(bytes / bandwidth,
FLOPs / rate)``); then the model's numbers: the path's kernel time, the same plus ``node_us`` a node,
the longest path weighted by each node's floor plus ``node_us`` (the lower bound for this chain of
nodes), and the work bound (every node's floor summed, as if there were one perfectly parallel
kernel). ``--replay-us`` (the measured replay, ``tools/bench_step.py``) is printed beside them.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: ncu rows of a library call that belong to the call before them (cuBLAS's split-K reductions).
REDUCTION = re.compile(r"splitKreduce|reduce_kernel|Reduce", re.I)


def build_graph(events: list[dict]) -> list[dict]:
    """Nodes ``{"id", "kind", "name", "phase", "stream", "deps", ...}`` from a launch trace."""
    nodes, frontier, phase = [], defaultdict(set), None
    for e in events:
        kind = e["kind"]
        if kind == "phase":
            phase = e["name"]
        elif kind == "fork":
            frontier[e["to"]] |= frontier[e["from"]]
        elif kind == "join":
            frontier[e["to"]] |= frontier[e["from"]]
        elif kind in ("kernel", "library"):
            node = {**e, "id": len(nodes), "phase": phase, "deps": sorted(frontier[e["stream"]])}
            nodes.append(node)
            frontier[e["stream"]] = {node["id"]}
        else:
            raise ValueError(f"unknown trace event kind {kind!r}")
    return nodes


#: :func:`align_library`: the tile edges a GEMM's FP32 FLOP count may be padded to (ncu counts the padded
#: tiles' FFMAs: a 512 x 4 x 256 GEMM at 32 x 32 tiles counts as 512 x 32 x 256), the cost of a pair whose
#: FLOPs are unknown (tensor-core kernels count none), the weight of a pair's distance in order, and the
#: largest FLOP cost a pair may have (a factor of 2.5) before it is left out.
PADS, UNKNOWN_COST, ORDER_WEIGHT, MAX_FLOP_COST = (1, 8, 32, 64, 128), 0.3, 0.5, math.log(2.5)


def _flop_cost(m: int, n: int, k: int, batch: int, got: float) -> float:
    """``|ln(got / expected)|`` for ``batch`` GEMMs of ``m x n x k`` at the padding of ``m``, ``n`` (to one of
    :data:`PADS`) and ``k`` (to 1 or 8) that fits best, at most 3; :data:`UNKNOWN_COST` when ``got`` is 0."""
    if got <= 0:
        return UNKNOWN_COST
    pad = lambda x, t: -(-x // t) * t  # noqa: E731
    want = [2.0 * batch * pad(m, a) * pad(n, b) * pad(k, c) for a in PADS for b in PADS for c in (1, 8)]
    return min(3.0, min(abs(math.log(got / w)) for w in want))


def align_library(calls: list[tuple[int, int, int, int]], got: list[float]) -> list[tuple[int, int]]:
    """Pairs ``(call, group)`` of the trace's library calls (``calls``: each GEMM's ``(m, n, k, batch)``, in capture
    order) and the profile's library kernel groups (``got``: their FP32 FLOPs from ncu's counters, in the
    profile's order, which across streams need not be the capture order), at the least total cost
    (``scipy.optimize.linear_sum_assignment``): each pair's :func:`_flop_cost` plus :data:`ORDER_WEIGHT`
    times the distance of their places in the two orders (0 to 1), which decides between calls of one
    shape. A pair whose FLOPs differ by more than :data:`MAX_FLOP_COST` is left out. Sorted by call."""
    import numpy as np
    from scipy.optimize import linear_sum_assignment

    L, G = len(calls), len(got)
    if not L or not G:
        return []
    flop = np.array([[_flop_cost(*c, g) for g in got] for c in calls])
    where = np.abs(np.arange(L)[:, None] / max(L - 1, 1) - np.arange(G)[None, :] / max(G - 1, 1))
    rows, cols = linear_sum_assignment(flop + ORDER_WEIGHT * where)
    return sorted((int(i), int(j)) for i, j in zip(rows, cols, strict=True) if flop[i, j] <= MAX_FLOP_COST)


def attach_profile(nodes: list[dict], rows: list[dict]) -> list[str]:
    """Give each node ``us``, ``bytes``, ``flops`` from its ncu rows; return warnings."""
    warnings = []
    by_name = defaultdict(list)
    groups: list[list[dict]] = []
    for r in rows:
        if r["name"].startswith("cudarl_"):
            by_name[r["name"]].append(r)
        elif groups and REDUCTION.search(r["name"]):
            groups[-1].append(r)
        else:
            groups.append([r])
    seen = defaultdict(int)
    libs = [n for n in nodes if n["kind"] == "library"]
    calls = [(n["m"], n["n"], n["k"], n.get("batch", 1)) for n in libs]  # a strided-batched GEMM names its batch
    pairs = align_library(calls, [sum(r["flops"] for r in g) for g in groups])
    if len(libs) != len(groups) or len(pairs) != len(libs):
        warnings.append(
            f"{len(libs)} library calls in the trace, {len(groups)} library kernel groups in the profile: "
            f"{len(pairs)} paired by FP32 FLOPs and order, {len(libs) - len(pairs)} call(s) and "
            f"{len(groups) - len(pairs)} group(s) left out"
        )
    for i, j in pairs:
        libs[i]["rows"] = groups[j]
    for n in nodes:
        if n["kind"] == "kernel":
            k = seen[n["name"]]
            seen[n["name"]] += 1
            if k < len(by_name[n["name"]]):
                n["rows"] = [by_name[n["name"]][k]]
        rs = n.get("rows", [])
        if not rs:
            warnings.append(f"node {n['id']} ({n['name']}, phase {n['phase']}) has no profile row: weighed 0")
        n["us"] = sum(r["us"] for r in rs)
        n["bytes"] = sum(r.get("bytes", 0.0) for r in rs)
        n["flops"] = sum(r.get("flops", 0.0) for r in rs)
        if n["kind"] == "library":  # tensor-core math is not in the FP32 counters: the GEMM's own count
            n["flops"] = max(n["flops"], 2.0 * n.get("batch", 1) * n["m"] * n["n"] * n["k"])
        n["kernels"] = [r["name"][:60] for r in rs]
    for name, rs in by_name.items():
        if seen[name] < len(rs):
            warnings.append(f"{len(rs) - seen[name]} profile row(s) of {name} match no launch in the trace")
    return warnings


def longest_path(nodes: list[dict], weight) -> tuple[float, list[int]]:
    """The heaviest path through the DAG (nodes are in a topological order: capture order)."""
    best, prev = [0.0] * len(nodes), [-1] * len(nodes)
    for n in nodes:
        base, arg = 0.0, -1
        for d in n["deps"]:
            if best[d] > base:
                base, arg = best[d], d
        best[n["id"]], prev[n["id"]] = base + weight(n), arg
    if not nodes:
        return 0.0, []
    end = max(range(len(nodes)), key=best.__getitem__)
    path = []
    while end >= 0:
        path.append(end)
        end = prev[end]
    return best[path[0]], path[::-1]


def analyse(trace: dict, rows: list[dict], floor: dict, replay_us: float | None = None) -> dict:
    nodes = build_graph(trace["events"])
    warnings = attach_profile(nodes, rows)
    node_us, gbps, tflops = floor["node_us"], floor["memory_gbps"], floor["fp32_tflops"]
    for n in nodes:  # bytes / (GB/s) in us: bytes / (gbps * 1e3); FLOPs / (TFLOP/s) in us: flops / (tflops * 1e6)
        n["floor_us"] = max(n["bytes"] / (gbps * 1e3), n["flops"] / (tflops * 1e6))
    kern_us, path = longest_path(nodes, lambda n: n["us"])
    floor_us, floor_path = longest_path(nodes, lambda n: n["floor_us"] + node_us)
    return {
        "graph": trace.get("graph"),
        "nodes": len(nodes),
        "floor_inputs": {"node_us": node_us, "memory_gbps": gbps, "fp32_tflops": tflops},
        "critical_path": [
            {k: nodes[i][k] for k in ("id", "phase", "name", "kernels", "us", "bytes", "flops", "floor_us")}
            for i in path
        ],
        "path_nodes": len(path),
        "path_kernel_us": kern_us,
        "path_kernel_plus_node_us": kern_us + node_us * len(path),
        "lower_bound_this_chain_us": floor_us,
        "lower_bound_chain_nodes": len(floor_path),
        "work_bound_us": sum(n["floor_us"] for n in nodes),
        "all_kernels_us": sum(n["us"] for n in nodes),
        "total_bytes": sum(n["bytes"] for n in nodes),
        "total_flops": sum(n["flops"] for n in nodes),
        "measured_replay_us": replay_us,
        "warnings": warnings,
    }


def print_report(res: dict) -> None:
    print(f"graph {res['graph']}: {res['nodes']} nodes; critical path of {res['path_nodes']} (kernel time, serialised)")
    print(f"{'phase':<16} {'us':>7} {'MB':>8} {'MFLOP':>9} {'floor us':>8}  kernel")
    for n in res["critical_path"]:
        same = n["kernels"] in ([], [n["name"][:60]])
        print(
            f"{str(n['phase'])[:16]:<16} {n['us']:7.2f} {n['bytes'] / 1e6:8.3f} {n['flops'] / 1e6:9.2f} "
            f"{n['floor_us']:8.2f}  {n['name']}{'' if same else ' = ' + ', '.join(n['kernels'])}"
        )
    f = res["floor_inputs"]
    print(
        f"node cost {f['node_us']:.2f} us, memory {f['memory_gbps']:.0f} GB/s, FP32 {f['fp32_tflops']:.1f} TFLOP/s "
        "(tools/bench_floor.py)"
    )
    print(f"path, kernels alone:                       {res['path_kernel_us']:8.2f} us")
    print(f"path, kernels + node cost:                 {res['path_kernel_plus_node_us']:8.2f} us")
    print(
        f"lower bound of this chain (floor + node):  {res['lower_bound_this_chain_us']:8.2f} us over "
        f"{res['lower_bound_chain_nodes']} nodes"
    )
    print(f"work bound (every node's floor, summed):   {res['work_bound_us']:8.2f} us")
    print(f"all kernels, serialised:                   {res['all_kernels_us']:8.2f} us")
    if res["measured_replay_us"] is not None:
        print(f"measured replay:                           {res['measured_replay_us']:8.2f} us")
    for w in res["warnings"]:
        print(f"warning: {w}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, required=True)
    ap.add_argument("--ncu", type=Path, required=True, help="ncu CSV of one replay (tools/gpu_profile.sh)")
    ap.add_argument("--floor", type=Path, required=True, help="tools/bench_floor.py's JSON")
    ap.add_argument("--replay-us", type=float, default=None, help="the measured replay time, printed beside")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from profile_step import read_csv

    rows = read_csv(args.ncu)
    if not rows:
        print(f"{args.ncu}: no kernel rows (ncu wrote no table)")
        return 1
    res = analyse(json.loads(args.trace.read_text()), rows, json.loads(args.floor.read_text())["model"], args.replay_us)
    print_report(res)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
