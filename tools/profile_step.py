#!/usr/bin/env python3
"""Per-kernel GPU times of one train-graph replay or one collect-graph replay of the reference
workload (DESIGN.md), read with Nsight Compute: where the step's time goes, kernel by kernel.

Three modes:

* ``--graph train|collect`` (under ``ncu``): builds the reference trainer, captures, fills the replay,
  replays the graph 10 times, then replays it once between ``cudaProfilerStart``/``Stop``::

    ncu --profile-from-start off --clock-control none --cache-control none --csv --page raw \\
        --print-units base --metrics "$(python3 tools/profile_step.py --metrics)" \\
        python3 tools/profile_step.py --graph train [--set net.gemm=cublas] > train.csv

* ``--summarize train.csv [collect.csv ...]``: one table per file, the kernels in launch order with
  their time, grid, block and registers, then the sum of kernel times and the kernels grouped by
  name. The sum of the kernel times against the replay's wall time (``tools/bench_step.py``) says how
  much of the step is kernels and how much is the gaps between nodes. Writes JSON with ``--out``.
  A file without ncu's table (ncu failed) gets one line saying so, and the others their tables.

* ``--graph train|collect --trace trace.json`` (no ncu): the graph's launches in capture order with
  their streams, phases and side-stream forks and joins, for ``tools/critical_path.py``.

* ``--metrics``: prints the comma list of the ncu metrics to collect for the table (:data:`METRICS`,
  the one list; ``tools/gpu_profile.sh`` passes it to ncu's ``--metrics``).

ncu runs every kernel alone (serialised, caches left warm with ``--cache-control none``), so
parallel graph branches are not overlapped here: the sum is the work, not the critical path.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The ncu metrics to collect for the table (``--metrics`` prints them for ncu's ``--metrics``): time,
#: launch shape, and what ``tools/critical_path.py`` weighs each node by: DRAM bytes, FP32 FLOPs.
METRICS = (
    "gpu__time_duration.sum",
    "launch__grid_size",
    "launch__block_size",
    "launch__registers_per_thread",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum",
    "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum",
)


def _num(r: dict, key: str) -> float:
    """A metric of an ncu row (``5,856`` style), 0 when ncu did not collect it."""
    try:
        return float(r.get(key, "").replace(",", ""))
    except ValueError:
        return 0.0


def _primed(graph_name: str, sets: list[str]):
    """The reference trainer, captured, with a replay that can be sampled; and the graph asked for."""
    from learning_check import _overrides

    from cudarl.bench import reference_bars, reference_config
    from cudarl.trainer import Trainer

    over = _overrides(sets)  # the CLI's --set syntax (values read as TOML)
    t = Trainer(reference_config("gpu", **over), run_dir=False, bars=reference_bars(), echo=lambda m: None)
    t._capture()
    while t._ready_rows() < t.cfg.agent.batch_size:
        t.collect_graph.replay()
        t.collect_steps += 1
    return t, t.train_graph if graph_name == "train" else t.collect_graph


def trace(graph_name: str, sets: list[str], out: Path) -> None:
    """Capture the graph again with ``cudarl.kernels.tracing`` on and write its launches, phases,
    forks and joins (the input of ``tools/critical_path.py --trace``)."""
    from cudarl import kernels

    t, graph = _primed(graph_name, sets)
    with kernels.tracing() as events:
        graph.capture()
    t.synchronize()
    out.write_text(json.dumps({"graph": graph_name, "set": sets, "events": events}, indent=1))
    print(f"wrote {out}: {sum(e['kind'] in ('kernel', 'library') for e in events)} launches")


def profile(graph_name: str, sets: list[str]) -> None:
    import cupy

    t, graph = _primed(graph_name, sets)
    for _ in range(10):
        graph.replay()
    t.synchronize()
    cupy.cuda.runtime.profilerStart()
    graph.replay()
    t.synchronize()
    cupy.cuda.runtime.profilerStop()


def read_csv(path: Path) -> list[dict]:
    """ncu's raw CSV (a units row after the header; ncu's own log lines before it are skipped).
    No rows when the file has no header row (ncu failed and wrote only its log)."""
    lines = path.read_text().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.DictReader(lines[start:]))
    kernels = []
    for r in rows:
        try:
            ns = float(r["gpu__time_duration.sum"].replace(",", ""))  # ncu writes 5,856
        except (KeyError, ValueError):
            continue  # the units row
        kernels.append(
            {
                "id": int(r["ID"]),
                "name": r["Kernel Name"],
                "us": ns / 1e3,
                "grid": r.get("Grid Size", ""),
                "block": r.get("Block Size", ""),
                "regs": r.get("launch__registers_per_thread", ""),
                "bytes": _num(r, "dram__bytes_read.sum") + _num(r, "dram__bytes_write.sum"),
                "flops": 2 * _num(r, "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum")
                + _num(r, "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum")
                + _num(r, "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum"),
            }
        )
    return kernels


def summarize(paths: list[Path], out: Path | None) -> None:
    result = {}
    for p in paths:
        ks = read_csv(p)
        if not ks:  # one line, then the other files
            print(f"\n== {p.name}: no kernel rows (ncu wrote no table: see its log, {p.with_suffix('.err').name})")
            result[p.name] = {"kernels": [], "total_us": 0.0}
            continue
        total = sum(k["us"] for k in ks)
        print(f"\n== {p.name}: {len(ks)} kernels, {total:.1f} us of kernel time (serialised)")
        print(f"{'#':>3} {'us':>7} {'grid':>14} {'block':>14} {'regs':>4}  kernel")
        for i, k in enumerate(ks):
            print(f"{i:>3} {k['us']:7.2f} {k['grid']:>14} {k['block']:>14} {k['regs']:>4}  {k['name'][:100]}")
        by = defaultdict(lambda: [0, 0.0])
        for k in ks:
            by[k["name"][:80]][0] += 1
            by[k["name"][:80]][1] += k["us"]
        print("-- by kernel name")
        for name, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            print(f"{us:8.2f} us {n:>3} x  {name}")
        result[p.name] = {"kernels": ks, "total_us": total}
    if out:
        out.write_text(json.dumps(result, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", choices=("train", "collect"))
    ap.add_argument(
        "--set", action="append", default=[], help="config override SECTION.FIELD=VALUE, as cudarl-train --set"
    )
    ap.add_argument("--summarize", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--metrics", action="store_true", help="print the ncu metrics to collect, comma-separated")
    ap.add_argument("--trace", type=Path, help="with --graph, no ncu: write the graph's launch trace JSON here")
    args = ap.parse_args()
    if args.trace and args.graph:
        trace(args.graph, args.set, args.trace)
    elif args.metrics:
        print(",".join(METRICS))
    elif args.summarize:
        summarize(args.summarize, args.out)
    elif args.graph:
        profile(args.graph, args.set)
    else:
        ap.error("give --graph (under ncu), --summarize or --metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
