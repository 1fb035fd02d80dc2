#!/usr/bin/env python3
"""Per-kernel GPU times of one train-graph replay or one collect-graph replay of the reference
workload (DESIGN.md), or of one train-graph replay of the joined population, read with Nsight Compute:
where the step's time goes, kernel by kernel.

Modes:

* ``--graph train|collect`` (under ``ncu``): builds the reference trainer, captures, fills the replay,
  replays the graph 10 times, then replays it once between ``cudaProfilerStart``/``Stop``::

    ncu --profile-from-start off --clock-control none --cache-control none --csv --page raw \\
        --print-units base --metrics "$(python3 tools/profile_step.py --metrics)" \\
        python3 tools/profile_step.py --graph train [--set net.gemm=cublas] > train.csv

* ``--graph joined --members P`` (under ``ncu``, as above): the joined population's train step of P
  members (default 64, issue 23's target size; :class:`cudarl.stacked_agent.StackedLearner`) built
  exactly as ``tools/bench_population.py``'s joined arm builds it (``bench_joined.build_joined``: the
  learner, its stacked replay filled with random rows, the step captured as one graph), then replayed 10
  times and once between ``cudaProfilerStart``/``Stop``. ``--set`` overrides go on top of the arm's
  config: ``--set net.dw_gemm=one_kernel`` (the ``joined-onekernel`` arm), ``--set net.tf32=true``; at any P
  the launchers pick the grid-barrier forms that fit (``--set run.grid_barrier=false``: the barrier-free ones).
  ``GRAPHS=joined MEMBERS=64 bash tools/gpu_profile.sh --set net.dw_gemm=one_kernel`` runs it.

* ``--summarize train.csv [collect.csv ...]``: one table per file, the kernels in launch order with
  their time, grid, block and registers, then the sum of kernel times and the kernels grouped by
  name (:func:`kernel_key`: the demangled name without its parameter list, so cuBLASLt's kernels of
  different algorithms and tiles stay apart). The sum of the kernel times against the replay's wall time
  (``tools/bench_step.py``, ``tools/bench_population.py``) says how much of the step is kernels and how
  much is the gaps between nodes. Writes JSON with ``--out``. A file without ncu's table (ncu failed)
  gets one line saying so, and the others their tables.

* ``--graph train|collect|joined --trace trace.json`` (no ncu): the graph's launches in capture order with
  their streams, phases and side-stream forks and joins, for ``tools/critical_path.py``.

* ``--graph train|collect|joined --timeline timeline.json [--replays N]`` (no ncu; CUPTI's Python bindings,
  ``cupti-python``, importable): every kernel of N replays (default 20) as it ran, beside the others, from
  CUPTI's concurrent-kernel activity records (name, start, end, stream): unlike ncu's serialised times,
  these are the replay's own. Prints the median replay's span, its kernels' summed and busy time, and the
  chain walked back from the last kernel to end (:func:`timeline_summary`:
  each kernel's latest-ending predecessor that ended before it started, the observed critical path).
  Writes the records and the summary as JSON.

* ``--graph train|collect --anatomy anatomy.json`` (no ncu, no CUPTI): the captured graph's nodes by type, its
  edges, depth and forks (:func:`dot_summary` of CUDA's DOT of it, written beside as ``anatomy.dot``), and what
  a replay costs the host to launch (idle, and with a replay in flight) against the replay's own time between
  two events, alone and back to back (:func:`anatomy`).

* ``--compare a.json b.json`` (two ``--timeline`` files: the step without and with some signals): each
  kernel of the first, by name and its place among that name's launches in a replay, with its median time over
  the replays in both (:func:`timeline_compare`): the shared kernels' growth is what the second step's other
  kernels cost them by running beside them (SMs, L2, memory), the second's own kernels are listed apart.

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
from statistics import median

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


#: ``--graph``'s choices: the reference trainer's two graphs and the joined population's train graph.
GRAPHS = ("train", "collect", "joined")


def _num(r: dict, key: str) -> float:
    """A metric of an ncu row (``5,856`` style), 0 when ncu did not collect it."""
    try:
        return float(r.get(key, "").replace(",", ""))
    except ValueError:
        return 0.0


def joined_graph(sets: list[str], members: int, device: str = "gpu"):
    """The joined population's train step of ``members`` members, captured, over its filled stacked replay:
    ``tools/bench_population.py``'s joined arm (:func:`bench_joined.build_joined` of
    :func:`bench_joined.joined_config`) with the ``--set`` overrides on top; ``net.tf32``,
    ``net.dw_gemm`` and ``run.grid_barrier`` default as that arm's (false, ``split_k``, true). Returns the
    :class:`bench_joined.JoinedStep` (learner, replay, windows, graph). ``device="cpu"``: the arm's
    NumPy smoke workload (the tests)."""
    from bench_joined import build_joined, joined_config
    from learning_check import _overrides

    over = _overrides(sets)
    net, run = over.pop("net", {}), over.pop("run", {})
    tf32, dw_gemm = bool(net.pop("tf32", False)), net.pop("dw_gemm", "split_k")
    cfg = joined_config(device, tf32, bool(run.pop("grid_barrier", True)), dw_gemm, net=net, run=run, **over)
    return build_joined(cfg, members, device)


def _primed(graph_name: str, sets: list[str], members: int = 0):
    """The graph asked for, captured, with a replay that can be sampled, and what waits for its work
    (``(graph, synchronize)``): the reference trainer's train or collect graph, or the joined
    population's train graph of ``members`` members (:func:`joined_graph`)."""
    if graph_name == "joined":
        graph = joined_graph(sets, members).graph
        return graph, graph.synchronize
    from learning_check import _overrides

    from cudarl.bench import reference_bars, reference_config
    from cudarl.trainer import Trainer

    over = _overrides(sets)  # the CLI's --set syntax (values read as TOML)
    t = Trainer(reference_config("gpu", **over), run_dir=False, bars=reference_bars(), echo=lambda m: None)
    t._capture()
    while t._ready_rows() < t.cfg.agent.batch_size:
        t.collect_graph.replay()
        t.collect_steps += 1
    return t.train_graph if graph_name == "train" else t.collect_graph, t.synchronize


def trace(graph_name: str, sets: list[str], out: Path, members: int = 0) -> None:
    """Capture the graph again with ``cudarl.kernels.tracing`` on and write its launches, phases,
    forks and joins (the input of ``tools/critical_path.py --trace``)."""
    from cudarl import kernels

    graph, synchronize = _primed(graph_name, sets, members)
    with kernels.tracing() as events:
        graph.capture()
    synchronize()
    head = {"graph": graph_name, "set": sets, **({"members": members} if graph_name == "joined" else {})}
    out.write_text(json.dumps({**head, "events": events}, indent=1))
    print(f"wrote {out}: {sum(e['kind'] in ('kernel', 'library') for e in events)} launches")


def profile(graph_name: str, sets: list[str], members: int = 0) -> None:
    import cupy

    graph, synchronize = _primed(graph_name, sets, members)
    for _ in range(10):
        graph.replay()
    synchronize()
    cupy.cuda.runtime.profilerStart()
    graph.replay()
    synchronize()
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


def kernel_key(name: str) -> str:
    """A kernel's name as the tables print and group it: ncu's demangled signature without the return type
    and the parameter list (``void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nt_align1>(T1::Params)``
    -> ``cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nt_align1>``), the rest whole: cuBLASLt's kernels
    differ past their 80th character (``..._execute_kernel__5x_cublas`` and
    ``..._execute_split_k_kernel__5x_cublas`` of one tile; the template arguments of ``splitKreduce_kernel``)."""
    key = name.strip().removeprefix("void ")
    if key.endswith(")"):  # the parameter list: back to its opening parenthesis
        depth = 0
        for i in range(len(key) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(key[i], 0)
            if depth == 0:
                key = key[:i].rstrip() or key
                break
    return key


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
            print(f"{i:>3} {k['us']:7.2f} {k['grid']:>14} {k['block']:>14} {k['regs']:>4}  {kernel_key(k['name'])}")
        by = defaultdict(lambda: [0, 0.0])
        for k in ks:
            by[kernel_key(k["name"])][0] += 1
            by[kernel_key(k["name"])][1] += k["us"]
        print("-- by kernel name")
        for name, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
            print(f"{us:8.2f} us {n:>3} x  {name}")
        result[p.name] = {"kernels": ks, "total_us": total}
    if out:
        out.write_text(json.dumps(result, indent=1))


def split_replays(records: list, replays: int | None = None, gap_us: float = 20.0) -> list:
    """The records of kernels (dicts with ``start`` and ``end`` in ns) split into replays, sorted by start:
    with ``replays`` (the count recorded, each waited for before the next), that many runs of equal length
    (every replay launches the same kernels); without, a new replay wherever a kernel starts more than
    ``gap_us`` after every earlier one ended. The count is the sure way: under CUPTI, a replay's root
    kernels ran 50-100 us before the rest of it (an H100, 62026c1), which the gaps cut off as replays."""
    ordered = sorted(records, key=lambda r: r["start"])
    if replays is not None:
        if replays < 1 or len(ordered) % replays:
            raise ValueError(f"split_replays: {len(ordered)} records are not {replays} replays of equal length")
        n = len(ordered) // replays
        return [ordered[i : i + n] for i in range(0, len(ordered), n)]
    out, end = [], None
    for r in ordered:
        if end is None or r["start"] > end + gap_us * 1e3:
            out.append([])
        out[-1].append(r)
        end = r["end"] if end is None else max(end, r["end"])
    return out


def timeline_summary(replay: list) -> dict:
    """One replay's kernels (dicts: ``name``, ``start``, ``end`` in ns, ``stream``): its span (first start to
    last end), the kernels' summed time, the time some kernel runs (their union), each kernel's offset and
    duration in us, and the observed chain: from the kernel that ends last, walking back to the kernel that
    ended last before each one started (its likeliest predecessor: a dependency, or the node before it on
    its stream), with the wait between them. The chain's kernel times plus its waits are the span."""
    ks = sorted(replay, key=lambda r: r["start"])
    t0 = ks[0]["start"]
    span = max(r["end"] for r in ks) - t0
    busy, cur_s, cur_e = 0, None, None
    for r in ks:  # the union of the kernels' intervals
        if cur_e is None or r["start"] > cur_e:
            busy += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = r["start"], r["end"]
        else:
            cur_e = max(cur_e, r["end"])
    busy += cur_e - cur_s
    chain, k = [], max(range(len(ks)), key=lambda i: ks[i]["end"])
    while k is not None:
        r = ks[k]
        before = [i for i in range(len(ks)) if ks[i]["end"] <= r["start"]]
        prev = max(before, key=lambda i: ks[i]["end"]) if before else None
        wait = (r["start"] - ks[prev]["end"]) if prev is not None else r["start"] - t0
        chain.append({"name": r["name"], "at_us": (r["start"] - t0) / 1e3, "us": (r["end"] - r["start"]) / 1e3,
                      "wait_us": wait / 1e3, "stream": r["stream"]})  # fmt: skip
        k = prev
    us = lambda v: v / 1e3  # noqa: E731
    return {
        "span_us": us(span),
        "kernel_us": us(sum(r["end"] - r["start"] for r in ks)),
        "busy_us": us(busy),
        "kernels": [
            {"name": r["name"], "at_us": us(r["start"] - t0), "us": us(r["end"] - r["start"]), "stream": r["stream"]}
            for r in ks
        ],  # fmt: skip
        "chain": chain[::-1],
    }


def _keyed_times(records: list, replays: int | None = None) -> dict:
    """``{(name, k): [us per replay]}``: each replay's k-th launch of a kernel name, over the replays
    (:func:`split_replays`)."""
    out: dict = defaultdict(list)
    for run in split_replays(records, replays):
        seen: dict = defaultdict(int)
        for r in sorted(run, key=lambda r: r["start"]):
            out[(r["name"], seen[r["name"]])].append((r["end"] - r["start"]) / 1e3)
            seen[r["name"]] += 1
    return out


def timeline_compare(a: list, b: list, replays: tuple = (None, None)) -> dict:
    """Two timelines' records (:func:`timeline`'s, ``a`` the step without, ``b`` with some work more): for each
    kernel launch both have (name and its place among that name's launches in a replay), its median time in
    each and the difference; the launches only ``b`` has, with their median times. Returns ``{"shared": [...],
    "only_b": [...], "shared_delta_us": sum of the differences, "only_b_us": sum of b's own}``. ``replays``:
    each one's count of replays, where known (:func:`split_replays`)."""
    ta, tb = _keyed_times(a, replays[0]), _keyed_times(b, replays[1])
    shared = [
        {"name": n, "k": k, "a_us": median(ta[(n, k)]), "b_us": median(tb[(n, k)])} for n, k in ta if (n, k) in tb
    ]
    for r in shared:
        r["delta_us"] = r["b_us"] - r["a_us"]
    only = [{"name": n, "k": k, "b_us": median(v)} for (n, k), v in tb.items() if (n, k) not in ta]
    return {
        "shared": sorted(shared, key=lambda r: -r["delta_us"]),
        "only_b": sorted(only, key=lambda r: -r["b_us"]),
        "shared_delta_us": sum(r["delta_us"] for r in shared),
        "only_b_us": sum(r["b_us"] for r in only),
    }


def compare(paths: list, out: Path | None) -> None:
    a, b = (json.loads(Path(p).read_text()) for p in paths)
    c = timeline_compare(a["records"], b["records"], (a.get("replays"), b.get("replays")))
    print(f"{paths[1]} against {paths[0]}: the shared kernels {c['shared_delta_us']:+.1f} us in all, "
          f"its own {len(c['only_b'])} kernels {c['only_b_us']:.1f} us (medians over the replays, summed)")  # fmt: skip
    print("shared, by growth (a, b, b - a us):")
    for r in c["shared"][:25]:
        print(f"  {r['a_us']:7.2f} {r['b_us']:7.2f} {r['delta_us']:+7.2f}  {r['name'][:80]} #{r['k']}")
    print("its own, by time:")
    for r in c["only_b"][:25]:
        print(f"  {r['b_us']:7.2f}  {r['name'][:80]} #{r['k']}")
    if out:
        out.write_text(json.dumps(c, indent=1))


def timeline(graph_name: str, sets: list[str], out: Path, replays: int = 20, members: int = 0) -> None:
    """Replay the graph ``replays`` times (after 10 unrecorded) with CUPTI recording every kernel, write the
    records and the median replay's :func:`timeline_summary` to ``out`` and print that summary. Recording is
    on before the graph is captured and instantiated (CUPTI may instrument a graph's kernels when it is made);
    the records of the build and the warm replays are dropped. Tracing adds its own time to each kernel:
    compare the spans with ``tools/bench_step.py``'s replay time of the same graph before reading them. On an
    H100 (62026c1, cupti-python 13.4.0) a replay's root kernels (the schedules, the selectivity fold) ran
    50-100 us before the rest of it, a wait the untraced replay does not have: the chain's first long wait,
    which the span includes; read the step from the kernel after it (the train step's sample)."""
    from cupti import cupti

    records: list = []
    K = cupti.ActivityKind.CONCURRENT_KERNEL

    def completed(activities: list) -> None:
        for a in activities:
            if a.kind == K:
                records.append({"name": a.name, "start": int(a.start), "end": int(a.end), "stream": int(a.stream_id)})

    cupti.activity_register_callbacks(lambda: (8 << 20, 0), completed)
    cupti.activity_enable(K)
    graph, synchronize = _primed(graph_name, sets, members)
    for _ in range(10):
        graph.replay()
    synchronize()
    cupti.activity_flush_all(1)
    records.clear()  # the build's and the warm replays'
    for _ in range(replays):
        graph.replay()
        synchronize()
    cupti.activity_flush_all(1)
    cupti.activity_disable(K)
    runs = split_replays(records, replays)
    summaries = sorted((timeline_summary(r) for r in runs), key=lambda s: s["span_us"])
    mid = summaries[len(summaries) // 2]
    print(f"{graph_name} {sets}: {len(runs)} replays, {len(records)} kernels; span (median replay) "
          f"{mid['span_us']:.1f} us, kernel time {mid['kernel_us']:.1f}, busy {mid['busy_us']:.1f}")  # fmt: skip
    print(f"spans over the replays: {[round(s['span_us'], 1) for s in summaries]}")
    print("the observed chain (wait before, start, time, kernel):")
    for c in mid["chain"]:
        print(f"  {c['wait_us']:6.2f} {c['at_us']:8.2f} {c['us']:7.2f}  {c['stream']:>4}  {c['name'][:90]}")
    out.write_text(
        json.dumps({"graph": graph_name, "set": sets, "replays": replays, "median": mid, "records": records}, indent=1)
    )
    print(f"wrote {out}")


def dot_summary(dot: str) -> dict:
    """A captured graph's DOT (``cudaGraphDebugDotPrint``'s, as ``cupy.cuda.Graph.debug_dot_str`` gives it)
    read back: its nodes by type, its edges, its roots and leaves, its depth (the most nodes on one path) and
    every node with more than two children (a fork) with the children's labels. A node's type is the first
    of CUDA's type words in its label (``MEMSET``, ``MEMCPY``, ``EMPTY``, ``HOST``, ``EVENT_RECORD``,
    ``WAIT_EVENT``, ``MEM_ALLOC``, ``MEM_FREE``, ``CONDITIONAL``, ``GRAPH``), else ``KERNEL``; its name is the
    label's first word that is neither a number nor a type word. Returns ``{"types": {type: count}, "nodes":
    n, "edges": n, "roots": [...], "leaves": n, "depth": n, "forks": [{"node", "name", "children"}]}``."""
    import re

    words = ("MEMSET", "MEMCPY", "EMPTY", "HOST", "EVENT_RECORD", "WAIT_EVENT", "MEM_ALLOC", "MEM_FREE",
             "CONDITIONAL", "GRAPH")  # fmt: skip
    nodes: dict = {}
    for m in re.finditer(r'"([^"]+)"\s*\[(.*?)\];', dot, re.S):
        attrs = m.group(2)
        label = re.search(r'label\s*=\s*"((?:[^"\\]|\\.)*)"', attrs, re.S)
        text = label.group(1) if label else ""
        kind = next((w for w in words if re.search(rf"\b{w}\b", text.upper())), "KERNEL")
        skip = (*words, "VOID")
        toks = [t for t in re.split(r"[\s\\|{}<>()]+", text) if t and not t.isdigit() and t.upper() not in skip]
        nodes[m.group(1)] = {"type": kind, "name": toks[0] if toks else ""}
    edges = [(a, b) for a, b in re.findall(r'"([^"]+)"\s*->\s*"([^"]+)"', dot) if a in nodes and b in nodes]
    kids: dict = defaultdict(list)
    parents: dict = defaultdict(list)
    for a, b in edges:
        kids[a].append(b)
        parents[b].append(a)
    depth: dict = {}

    def deep(n: str) -> int:  # iterative longest path, in nodes, ending at n
        stack = [n]
        while stack:
            x = stack[-1]
            todo = [p for p in parents[x] if p not in depth]
            if todo:
                stack.extend(todo)
                continue
            depth[x] = 1 + max((depth[p] for p in parents[x]), default=0)
            stack.pop()
        return depth[n]

    types: dict = defaultdict(int)
    for n, v in nodes.items():
        types[v["type"]] += 1
        deep(n)
    forks = [{"node": n, "name": nodes[n]["name"], "children": [nodes[c]["name"] or nodes[c]["type"] for c in kids[n]]}
             for n in nodes if len(kids[n]) > 2]  # fmt: skip
    return {
        "types": dict(sorted(types.items())),
        "nodes": len(nodes),
        "edges": len(edges),
        "roots": [nodes[n]["name"] or nodes[n]["type"] for n in nodes if not parents[n]],
        "leaves": sum(not kids[n] for n in nodes),
        "depth": max(depth.values(), default=0),
        "forks": forks,
    }


def anatomy(graph_name: str, sets: list[str], out: Path, repeats: int = 200) -> None:
    """The captured graph's shape (:func:`dot_summary` of its DOT) and its launch costs, without CUPTI: the
    host's time in one ``replay()`` call on an idle GPU and with replays queued, the replay's time between two
    events (one replay, as ``tools/bench_step.py`` times it; and ``BACK_TO_BACK`` replays), medians over
    ``repeats``. Where the host's time to launch approaches the replay's, the single replay's time holds launch
    work the training loop overlaps. Writes the DOT beside the JSON (``out`` with ``.dot``)."""
    import time

    import cupy

    from cudarl.bench import BACK_TO_BACK

    graph, synchronize = _primed(graph_name, sets)
    g = graph._graph
    if hasattr(g, "debug_dot_str"):
        out.with_suffix(".dot").write_text(g.debug_dot_str())
    else:  # a CuPy without the method: the runtime's call writes the file itself
        cupy.cuda.runtime.graphDebugDotPrint(g.graph, str(out.with_suffix(".dot")), 0)
    dot = out.with_suffix(".dot").read_text()
    shape = dot_summary(dot)
    for _ in range(10):
        graph.replay()
    synchronize()
    s = graph.stream
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    idle, queued, one, b2b = [], [], [], []
    for _ in range(repeats):
        synchronize()
        t0 = time.perf_counter()
        graph.replay()
        idle.append((time.perf_counter() - t0) * 1e6)
        t0 = time.perf_counter()
        graph.replay()  # the first still running
        queued.append((time.perf_counter() - t0) * 1e6)
        synchronize()
        start.record(s)
        graph.replay()
        end.record(s)
        end.synchronize()
        one.append(cupy.cuda.get_elapsed_time(start, end) * 1e3)
        start.record(s)
        for _ in range(BACK_TO_BACK):
            graph.replay()
        end.record(s)
        end.synchronize()
        b2b.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / BACK_TO_BACK)
    times = {"launch_idle_us": median(idle), "launch_queued_us": median(queued), "replay_us": median(one),
             f"replay_{BACK_TO_BACK}_back_to_back_us": median(b2b)}  # fmt: skip
    print(f"{graph_name} {sets}: {shape['nodes']} nodes {shape['types']}, {shape['edges']} edges, depth "
          f"{shape['depth']}, {len(shape['roots'])} roots, {shape['leaves']} leaves")  # fmt: skip
    print("  " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    for f in shape["forks"]:
        print(f"  fork {f['name'] or f['node']} -> {len(f['children'])}: {', '.join(f['children'])[:200]}")
    out.write_text(json.dumps({"graph": graph_name, "set": sets, **times, **shape}, indent=1))
    print(f"wrote {out} and {out.with_suffix('.dot')}")


def build_parser() -> argparse.ArgumentParser:
    from bench_joined import TARGET_P  # --members' default: the size of issue 23's targets

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", choices=GRAPHS)
    ap.add_argument(
        "--set", action="append", default=[], help="config override SECTION.FIELD=VALUE, as cudarl-train --set"
    )
    ap.add_argument(
        "--members",
        type=int,
        default=TARGET_P,
        help=f"--graph joined: the population's size P (default {TARGET_P})",
    )
    ap.add_argument("--summarize", nargs="+", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--metrics", action="store_true", help="print the ncu metrics to collect, comma-separated")
    ap.add_argument("--trace", type=Path, help="with --graph, no ncu: write the graph's launch trace JSON here")
    ap.add_argument("--timeline", type=Path, help="with --graph, no ncu: CUPTI's record of N replays, JSON here")
    ap.add_argument("--replays", type=int, default=20, help="--timeline: the replays recorded")
    ap.add_argument(
        "--anatomy", type=Path, help="with --graph train|collect, no ncu: its nodes, forks and launch costs, JSON here"
    )
    ap.add_argument("--compare", nargs=2, type=Path, help="two --timeline files: the kernels' times side by side")
    return ap


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.members < 1:
        ap.error(f"--members must be at least 1, got {args.members}")
    if args.trace and args.graph:
        trace(args.graph, args.set, args.trace, args.members)
    elif args.anatomy and args.graph:
        if args.graph == "joined":
            ap.error("--anatomy takes --graph train or collect")
        anatomy(args.graph, args.set, args.anatomy)
    elif args.compare:
        compare(args.compare, args.out)
    elif args.timeline and args.graph:
        timeline(args.graph, args.set, args.timeline, args.replays, args.members)
    elif args.metrics:
        print(",".join(METRICS))
    elif args.summarize:
        summarize(args.summarize, args.out)
    elif args.graph:
        profile(args.graph, args.set, args.members)
    else:
        ap.error("give --graph (under ncu), --summarize or --metrics")
    return 0


if __name__ == "__main__":
    sys.exit(main())
