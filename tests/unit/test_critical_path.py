"""tools/critical_path.py on a made-up trace and ncu table: the graph's edges, the matching of
profile rows to launches, the longest path and the floor model's numbers."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import critical_path as cpath  # noqa: E402
from profile_step import METRICS  # noqa: E402

MAIN, SIDE = 1, 2
# phase a: k1 on main; fork: k2 (slow) on the side while a GEMM (split-K: two library kernels) and
# k3 run on main; join; k4 on main. The longest path by time: k1 -> k2 -> k4.
EVENTS = [
    {"kind": "phase", "name": "a"},
    {"kind": "kernel", "name": "cudarl_x_k1", "stream": MAIN, "grid": [1], "block": [32]},
    {"kind": "fork", "from": MAIN, "to": SIDE},
    {"kind": "kernel", "name": "cudarl_x_k2", "stream": SIDE, "grid": [1], "block": [32]},
    {"kind": "phase", "name": "b"},
    {"kind": "library", "name": "cublas_sgemm", "stream": MAIN, "m": 512, "n": 256, "k": 256, "beta": 0.0},
    {"kind": "kernel", "name": "cudarl_x_k3", "stream": MAIN, "grid": [1], "block": [32]},
    {"kind": "join", "from": SIDE, "to": MAIN},
    {"kind": "kernel", "name": "cudarl_x_k4", "stream": MAIN, "grid": [1], "block": [32]},
    {"kind": "kernel", "name": "cudarl_x_k2", "stream": SIDE, "grid": [1], "block": [32]},  # a second k2 after
]
ROWS = [  # ncu's order need not be the capture order; cudarl kernels match by name and occurrence
    ("cudarl_x_k1", 1.0, 4e6, 0),
    ("sm90_xmma_gemm_f32f32", 3.0, 1e6, 2 * 512 * 256 * 256),
    ("splitKreduce_kernel", 1.5, 5e5, 0),
    ("cudarl_x_k2", 8.0, 0, 1e6),
    ("cudarl_x_k3", 2.0, 0, 0),
    ("cudarl_x_k4", 1.0, 1e6, 0),
    ("cudarl_x_k2", 0.5, 0, 0),
]
FLOOR = {"node_us": 1.0, "memory_gbps": 4000.0, "fp32_tflops": 50.0}


def _rows():
    return [
        {"name": n, "us": us, "bytes": b, "flops": f, "grid": "", "block": "", "regs": "", "id": i}
        for i, (n, us, b, f) in enumerate(ROWS)
    ]


def test_edges_follow_streams_forks_and_joins():
    nodes = cpath.build_graph(EVENTS)
    assert [n["name"] for n in nodes] == [
        "cudarl_x_k1",
        "cudarl_x_k2",
        "cublas_sgemm",
        "cudarl_x_k3",
        "cudarl_x_k4",
        "cudarl_x_k2",
    ]
    assert [n["deps"] for n in nodes] == [[], [0], [0], [2], [1, 3], [1]]
    assert [n["phase"] for n in nodes] == ["a", "a", "b", "b", "b", "b"]


def test_rows_are_matched_and_the_longest_path_found():
    res = cpath.analyse({"graph": "t", "events": EVENTS}, _rows(), FLOOR, replay_us=13.0)
    assert res["warnings"] == []
    path = [n["name"] for n in res["critical_path"]]
    assert path == ["cudarl_x_k1", "cudarl_x_k2", "cudarl_x_k4"]  # 1 + 8 + 1 against 1 + 4.5 + 2 + 1
    assert res["path_kernel_us"] == pytest.approx(10.0) and res["path_kernel_plus_node_us"] == pytest.approx(13.0)
    gemm = next(n for n in cpath.build_graph(EVENTS) if n["kind"] == "library")
    assert gemm["name"] == "cublas_sgemm"
    assert res["all_kernels_us"] == pytest.approx(17.0)  # the split-K reduction counted with its GEMM
    # floors: k1 4 MB / 4000 GB/s = 1 us; gemm 67 MFLOP / 50 TFLOP/s = 1.34 us; k2 1 MFLOP: 0.02 us
    k1 = res["critical_path"][0]
    assert k1["floor_us"] == pytest.approx(1.0)
    assert res["work_bound_us"] == pytest.approx(1.0 + 0.02 + 2 * 512 * 256 * 256 / 50e6 + 0.25)
    # the floor path: node cost 1 us each, so the longest chain (k1, gemm, k3, k4) wins
    assert res["lower_bound_chain_nodes"] == 4
    assert res["lower_bound_this_chain_us"] == pytest.approx(4 * 1.0 + 1.0 + 2 * 512 * 256 * 256 / 50e6 + 0.25)


def test_a_launch_without_a_row_is_reported():
    res = cpath.analyse({"graph": "t", "events": EVENTS}, [r for r in _rows() if r["name"] != "cudarl_x_k3"], FLOOR)
    assert any("cudarl_x_k3" in w and "no profile row" in w for w in res["warnings"])


def test_the_command_line_reads_ncu_csv(tmp_path):
    header = ["ID", "Kernel Name", "Grid Size", "Block Size", *METRICS]
    with open(tmp_path / "t.csv", "w", newline="") as f:
        f.write("==PROF== a log line ncu prints first\n")
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(header)
        w.writerow(["", "", "", "", "nsecond"] + [""] * (len(METRICS) - 1))  # the units row
        for i, (name, us, b, fl) in enumerate(ROWS):
            vals = {
                "gpu__time_duration.sum": f"{us * 1e3:,.0f}",
                "dram__bytes_read.sum": str(b / 2),
                "dram__bytes_write.sum": str(b / 2),
                "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": str(fl / 2),
            }
            w.writerow([i, name, "(1, 1, 1)", "(32, 1, 1)", *(vals.get(m, "0") for m in METRICS)])
    (tmp_path / "trace.json").write_text(json.dumps({"graph": "t", "events": EVENTS}))
    (tmp_path / "floor.json").write_text(json.dumps({"model": FLOOR}))
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "critical_path.py"), "--trace", "trace.json", "--ncu", "t.csv"]
        + ["--floor", "floor.json", "--replay-us", "13", "--out", "cp.json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads((tmp_path / "cp.json").read_text())
    assert [n["name"] for n in res["critical_path"]] == ["cudarl_x_k1", "cudarl_x_k2", "cudarl_x_k4"]
    assert res["critical_path"][0]["bytes"] == pytest.approx(4e6) and "measured replay" in r.stdout


@pytest.mark.gpu
def test_gpu_a_capture_traces_its_launches_forks_and_joins(cp):
    import numpy as np

    from cudarl import blas, kernels
    from cudarl.graph import SideStream, StepGraph
    from cudarl.ops import testing

    x, y = cp.ones(64, np.float32), cp.ones(64, np.float32)
    a, b, c = cp.ones((8, 8), np.float32), cp.ones((8, 8), np.float32), cp.empty((8, 8), np.float32)
    side = SideStream()

    def branch():
        testing.axpb(x, 2.0, 0.0)
        with side.fork():
            testing.axpb(y, 3.0, 0.0)
        blas.gemm(a, b, c)
        side.join()
        testing.empty()

    g = StepGraph("trace_probe", [("one", lambda: testing.empty()), ("two", branch)])
    with kernels.tracing() as events:
        g.capture()
    nodes = cpath.build_graph(events)
    assert [(n["name"], n["phase"]) for n in nodes] == [
        ("cudarl_testing_empty", "one"),
        ("cudarl_testing_axpb", "two"),
        ("cudarl_testing_axpb", "two"),
        ("cublas_sgemm", "two"),
        ("cudarl_testing_empty", "two"),
    ]
    assert [n["deps"] for n in nodes] == [[], [0], [1], [1], [2, 3]]
    g.replay()
    g.synchronize()
    assert float(x[0]) == 2.0 and float(y[0]) == 3.0 and float(c[0, 0]) == 8.0


def test_library_groups_are_paired_with_calls_by_flops_whatever_their_order():
    """Library kernel groups are paired with the traced calls by their FP32 FLOPs (a tile's padding allowed),
    also where ncu's order is not the capture order, and a group no traced call made (here an epilogue pass)
    is left out and reported."""
    big, small = (512, 256, 256, 1), (512, 4, 256, 1)  # (m, n, k, batch): a 256 -> 4 head's forward
    fbig, fsmall = 2 * 512 * 256 * 256, 2 * 512 * 32 * 256  # the small one at 32 x 32 tiles: n padded to 32
    assert cpath.align_library([big, small], [fbig * 1.01, 3e4, fsmall]) == [(0, 0), (1, 2)]
    assert cpath.align_library([big, small], [fsmall, fbig]) == [(0, 1), (1, 0)]  # another order
    assert cpath.align_library([big, big], [fbig, fbig]) == [(0, 0), (1, 1)]  # one shape: in order
    assert cpath.align_library([big, small], [0.0, 0.0]) == [(0, 0), (1, 1)]  # tensor cores: in order
    batched = (512, 256, 256, 64)  # a population's strided-batched GEMM: 64 members' FLOPs
    assert cpath.align_library([big, batched], [64 * fbig, fbig]) == [(0, 1), (1, 0)]
    events = [
        {"kind": "phase", "name": "a"},
        {"kind": "library", "name": "cublas_sgemm", "stream": MAIN, "m": 512, "n": 256, "k": 256, "beta": 0.0},
        {"kind": "library", "name": "cublas_sgemm", "stream": SIDE, "m": 512, "n": 4, "k": 256, "beta": 0.0},
    ]
    rows = [
        {"name": n, "us": us, "bytes": 0.0, "flops": f, "grid": "", "block": "", "regs": "", "id": i}
        for i, (n, us, f) in enumerate(
            [("gemv", 2.0, fsmall), ("epilogue_globalKernel", 20.0, 3e4), ("gemm", 7.0, fbig)]
        )
    ]
    nodes = cpath.build_graph(events)
    warnings = cpath.attach_profile(nodes, rows)
    assert [(n["n"], n["us"]) for n in nodes] == [(256, 7.0), (4, 2.0)]  # the epilogue group belongs to no call
    assert len(warnings) == 1 and "0 call(s) and 1 group(s) left out" in warnings[0]
