"""tools/profile_step.py without a GPU or ncu: ``--graph joined`` parses and its build (the joined arm's
``build_joined``, tools/bench_joined.py) builds a tiny joined graph on the NumPy backend with the
``--set`` overrides on top; ``--summarize`` keeps cuBLASLt's kernels of different algorithms apart and
groups the ``_members`` kernels; tools/gpu_profile.sh passes ``--members`` to the joined graph only."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench_joined as bj  # noqa: E402
import profile_step as ps  # noqa: E402


def test_joined_graph_option_parses():
    args = ps.build_parser().parse_args(["--graph", "joined", "--members", "3", "--set", "net.tf32=true"])
    assert (args.graph, args.members, args.set) == ("joined", 3, ["net.tf32=true"])
    assert ps.build_parser().parse_args(["--graph", "joined"]).members == bj.TARGET_P
    assert ps.build_parser().parse_args(["--graph", "train"]).graph == "train"
    with pytest.raises(SystemExit):
        ps.main(["--graph", "joined", "--members", "0"])


def test_joined_graph_builds_the_joined_arm_on_numpy():
    """The bench's joined arm (its CPU workload) with the overrides on top, captured and replayable."""
    step = ps.joined_graph(["net.dw_gemm=one_kernel", "agent.batch_size=8"], 3, device="cpu")
    assert step.learner.cfg == bj.joined_config("cpu", dw_gemm="one_kernel", agent={"batch_size": 8})
    assert step.learner.online.dw_batched and step.graph.captured
    step.graph.replay()
    loss = np.asarray(step.learner.loss)
    assert loss.shape == (3,) and np.all(np.isfinite(loss))
    plain = ps.joined_graph(["run.grid_barrier=false"], 2, device="cpu")  # the arm's defaults otherwise
    assert plain.learner.cfg == bj.joined_config("cpu", grid_barrier=False)
    assert not plain.learner.online.dw_batched and not plain.learner.cfg.net.tf32


XMMA = "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_tensor_aligna4_alignc4_"
SPLITK = "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, 0, float, float, float, 1>"
KERNELS = [  # (ncu's Kernel Name, ns)
    (XMMA + "execute_kernel__5x_cublas", 10_000),
    (XMMA + "execute_split_k_kernel__5x_cublas", 20_000),
    (SPLITK + "(cublasLt::cublasSplitKParams<T6>, const T4 *, const T9 *, T9 *)", 3_000),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nt_align1>(T1::Params)", 4_000),
    ("cudarl_optim_adam_update_members", 5_000),
    ("cudarl_optim_adam_update_members", 6_000),
    (XMMA + "execute_kernel__5x_cublas", 1_000),
]


def _ncu_csv(path: Path) -> None:
    """A file as ``ncu --csv --page raw --print-units base`` writes it: a log line, the header, the units
    row, a row per kernel (numbers with thousands separators)."""
    head = ["ID", "Kernel Name", "Grid Size", "Block Size", *ps.METRICS]
    with path.open("w", newline="") as fh:
        fh.write("==PROF== Disconnected from process 1\n")
        w = csv.writer(fh, quoting=csv.QUOTE_ALL)
        w.writerow(head)
        w.writerow(["", "", "", "", "nsecond", *[""] * (len(ps.METRICS) - 1)])
        for i, (name, ns) in enumerate(KERNELS):
            w.writerow([i, name, "(8, 1, 64)", "(128, 1, 1)", f"{ns:,}", *["0"] * (len(ps.METRICS) - 1)])


def test_summarize_keeps_cublaslt_algorithms_apart(tmp_path, capsys):
    _ncu_csv(tmp_path / "ncu_joined.csv")
    ps.summarize([tmp_path / "ncu_joined.csv"], tmp_path / "profile.json")
    text = capsys.readouterr().out
    by_name = text.split("-- by kernel name\n", 1)[1].splitlines()
    got = {line.split("x  ", 1)[1]: line.split(" us", 1)[0].strip() for line in by_name}
    assert got == {
        XMMA + "execute_kernel__5x_cublas": "11.00",
        XMMA + "execute_split_k_kernel__5x_cublas": "20.00",
        SPLITK.removeprefix("void "): "3.00",
        "cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nt_align1>": "4.00",
        "cudarl_optim_adam_update_members": "11.00",
    }
    assert "7 kernels, 49.0 us" in text
    saved = json.loads((tmp_path / "profile.json").read_text())["ncu_joined.csv"]
    assert [k["name"] for k in saved["kernels"]] == [n for n, _ in KERNELS]  # the JSON keeps ncu's names


def test_gpu_profile_passes_members_to_the_joined_graph_only(tmp_path):
    """gpu_profile.sh with a stand-in ncu and python3 (each noting its arguments): train's command lines
    as before, the joined graph's with --members and the --set arguments."""
    log = tmp_path / "calls.log"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "ncu").write_text(f'#!/bin/sh\necho "ncu $*" >> {log}\n')
    (bin_ / "python3").write_text(  # the tool's own --metrics and --summarize run for real
        f'#!/bin/sh\ncase "$*" in *--metrics*|*--summarize*) exec {sys.executable} "$@";; esac\n'
        f'echo "python3 $*" >> {log}\n'
    )
    for f in bin_.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}
    env.update(GRAPHS="train joined", MEMBERS="3", NCU=str(bin_ / "ncu"))
    cmd = ["bash", str(ROOT / "tools" / "gpu_profile.sh"), "--set", "net.dw_gemm=one_kernel"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    calls = log.read_text().splitlines()
    tool = "python3 tools/profile_step.py"
    ncu = [c.split(" python3 ", 1)[1] for c in calls if c.startswith("ncu ")]
    assert ncu == [
        "tools/profile_step.py --graph train --set net.dw_gemm=one_kernel",
        "tools/profile_step.py --graph joined --members 3 --set net.dw_gemm=one_kernel",
    ]
    out = tmp_path / "out"
    assert [c for c in calls if c.startswith("python3 ")] == [
        f"{tool} --graph train --trace {out}/trace_train.json --set net.dw_gemm=one_kernel",
        f"{tool} --graph joined --members 3 --trace {out}/trace_joined.json --set net.dw_gemm=one_kernel",
    ]
    assert "no kernel rows" in r.stdout  # the stand-in ncu wrote no table


def test_timeline_splits_replays_at_gaps_and_walks_the_chain_back_from_the_last_kernel():
    """Two replays 50 us apart; in each, a (stream 1, 0-10 us) then c (stream 1, 12-30) beside b (stream 2,
    1-5): the chain is a then c (of the kernels that ended before c started, a ended last), the span 30 us,
    the kernels' time 32, their union 28."""
    import profile_step as ps

    def k(name, s, e, stream):
        return {"name": name, "start": int(s * 1e3), "end": int(e * 1e3), "stream": stream}

    one = [k("a", 0, 10, 1), k("b", 1, 5, 2), k("c", 12, 30, 1)]
    two = [dict(r, start=r["start"] + 80_000, end=r["end"] + 80_000) for r in one]
    runs = ps.split_replays(two + one)
    assert [[r["name"] for r in run] for run in runs] == [["a", "b", "c"], ["a", "b", "c"]]
    # a root kernel long before the rest of its replay (as under CUPTI): the gaps cut it off, the count does not
    late = [one[0], *(dict(r, start=r["start"] + 60_000, end=r["end"] + 60_000) for r in one[1:])]
    late2 = [dict(r, start=r["start"] + 200_000, end=r["end"] + 200_000) for r in late]
    assert len(ps.split_replays(late + late2)) == 4
    assert [[r["name"] for r in run] for run in ps.split_replays(late2 + late, replays=2)] == [["a", "b", "c"]] * 2
    with pytest.raises(ValueError, match="not 4 replays"):
        ps.split_replays(late + late2, replays=4)
    s = ps.timeline_summary(runs[1])
    assert s["span_us"] == 30 and s["kernel_us"] == 32 and s["busy_us"] == 28
    assert [c["name"] for c in s["chain"]] == ["a", "c"] and [c["wait_us"] for c in s["chain"]] == [0, 2]
    gapped = ps.timeline_summary([k("a", 0, 10, 1), k("c", 15, 20, 1)])
    assert gapped["busy_us"] == 15 and gapped["span_us"] == 20


def test_timeline_compare_sets_the_shared_kernels_growth_apart_from_the_added_ones(tmp_path, capsys):
    """Two replays each: without, a (10 us) and a second a (4); with, a 12 and 4, and x (3) beside them: the
    shared launches matched by name and place (a #0 +2, a #1 0), x the second step's own; --compare prints
    both and writes the JSON."""
    import profile_step as ps

    def run(at, kernels):
        return [
            {"name": n, "start": int((at + s) * 1e3), "end": int((at + e) * 1e3), "stream": 1} for n, s, e in kernels
        ]

    a = run(0, [("a", 0, 10), ("a", 11, 15)]) + run(100, [("a", 0, 10), ("a", 11, 15)])
    b = run(0, [("a", 0, 12), ("x", 1, 4), ("a", 13, 17)]) + run(100, [("a", 0, 12), ("x", 1, 4), ("a", 13, 17)])
    c = ps.timeline_compare(a, b)
    assert [(r["name"], r["k"], r["delta_us"]) for r in c["shared"]] == [("a", 0, 2.0), ("a", 1, 0.0)]
    assert [(r["name"], r["b_us"]) for r in c["only_b"]] == [("x", 3.0)]
    assert c["shared_delta_us"] == 2.0 and c["only_b_us"] == 3.0
    paths = []
    for name, recs in (("a", a), ("b", b)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"records": recs}))
    assert ps.main(["--compare", *map(str, paths), "--out", str(tmp_path / "c.json")]) == 0
    assert "+2.00" in capsys.readouterr().out and json.loads((tmp_path / "c.json").read_text())["only_b_us"] == 3.0


DOT = """digraph dot {
subgraph cluster_1 {
label="graph_1" graph[style="dashed"];
"graph_1_node_0"[style="solid" shape="rectangle" label="0
cudarl_replay_gather
\\<\\<\\<(4,1,1),(256,1,1),0\\>\\>\\>"];
"graph_1_node_1"[style="solid" shape="rectangle" label="1
void cutlass_gemm(Params)"];
"graph_1_node_2"[style="solid" shape="invtrapezium" label="2
MEMSET
"];
"graph_1_node_3"[style="solid" shape="rectangle" label="3
cudarl_loss"];
"graph_1_node_4"[style="solid" shape="ellipse" label="4
EMPTY"];
"graph_1_node_0" -> "graph_1_node_1";
"graph_1_node_0" -> "graph_1_node_2";
"graph_1_node_0" -> "graph_1_node_3";
"graph_1_node_1" -> "graph_1_node_4";
"graph_1_node_2" -> "graph_1_node_3";
"graph_1_node_3" -> "graph_1_node_4";
}
}
"""


def test_dot_summary_counts_types_depth_and_forks():
    """The anatomy's reading of CUDA's DOT: types from the label's type word (a kernel's label has none), the
    kernel's name past ``void``, the longest path in nodes, and a node with three children listed as a fork."""
    got = ps.dot_summary(DOT)
    assert got["types"] == {"EMPTY": 1, "KERNEL": 3, "MEMSET": 1}
    assert (got["nodes"], got["edges"], got["leaves"], got["depth"]) == (5, 6, 1, 4)
    assert got["roots"] == ["cudarl_replay_gather"]
    children = ["cutlass_gemm", "MEMSET", "cudarl_loss"]
    assert got["forks"] == [{"node": "graph_1_node_0", "name": "cudarl_replay_gather", "children": children}]
    assert ps.build_parser().parse_args(["--graph", "train", "--anatomy", "a.json"]).anatomy == Path("a.json")
    with pytest.raises(SystemExit):
        ps.main(["--graph", "joined", "--anatomy", "a.json"])
