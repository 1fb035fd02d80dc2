"""tools/bench_population.py's joined arm (its code in tools/bench_joined.py; issue 23's agent axis,
:class:`cudarl.stacked_agent.StackedLearner`) on the NumPy backend at tiny sizes: its rows (names and units; no
timing is asserted), a size the learner refuses recorded as rows in both forms instead of a crash, the speed-up
rows against the other arms, and ``--device cpu`` end to end (the table and the JSON). And the ``sweep-scaling``
arm (tools/sweep_scaling.py) on a local Ray with 1 and 2 CPU workers."""

import argparse
import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench_joined as bj  # noqa: E402
import bench_population as bp  # noqa: E402

CASE = "cudarl joined (agent axis), FP32"
#: metric (after "P=<P>: ") -> unit of every row the joined arm writes for a size it ran
JOINED_ROWS = {
    "step": "us",
    "agent-updates/s (summed)": "1/s",
    "us per agent-update": "us",
    "achieved": "TFLOP/s",
    "build + fill + capture": "s",
    "memory per agent (tracemalloc, NumPy backend)": "MiB",
    "replay memory per agent": "MiB",
    "loss": "",
    "optimiser": "",
    "weight gradients (net.dw_gemm)": "",
    "every member's loss finite": "",
}


def _by_size(rows, case=CASE) -> dict:
    """``{P: {metric: row}}`` of ``case``'s rows."""
    out: dict = {}
    for r in rows:
        if r["case"] == case:
            size, metric = r["metric"].split(": ", 1)
            out.setdefault(int(size.removeprefix("P=")), {})[metric] = r
    return out


def test_joined_arm_rows_on_numpy():
    rows, extra = [], {}
    got = bj.joined_arm(False, (1, 3), argparse.Namespace(repeats=1, profile=None), rows, extra, None, device="cpu")
    assert sorted(got) == [1, 3] and all(us > 0 for us in got.values())
    sizes = _by_size(rows)
    assert sorted(sizes) == [1, 3]
    for P, metrics in sizes.items():
        assert {m: r["unit"] for m, r in metrics.items()} == JOINED_ROWS, P
        assert metrics["every member's loss finite"]["value"] is True
        assert metrics["memory per agent (tracemalloc, NumPy backend)"]["value"] > 0
        assert metrics["step"]["value"] == got[P]
    assert not [r for r in rows if r["case"] != CASE], "a size the learner builds writes no failure or refusal"
    assert sorted(extra["joined_fp32"]["step_us"]) == [1, 3]
    assert extra["joined_fp32"]["grid_barrier"] == {1: True, 3: True}
    one = "one launch (grid barrier)"  # NumPy: no residency, the one launches at every P
    assert {(m["loss"]["value"], m["optimiser"]["value"]) for m in sizes.values()} == {(one, one)}
    assert extra["joined_fp32"]["one_launch"] == {P: {"targets_loss": True, "adam": True} for P in (1, 3)}
    assert {m["weight gradients (net.dw_gemm)"]["value"] for m in sizes.values()} == {
        "split_k: a GEMM per member a layer"
    }


def test_joined_onekernel_arm_rows_on_numpy():
    """The joined arm with net.dw_gemm = "one_kernel": cases and JSON of their own, a row saying so, and its
    speed-up over the split-K arm."""
    rows, extra = [], {}
    args = argparse.Namespace(repeats=1, profile=None)
    got = bj.joined_arm(False, (1, 3), args, rows, extra, None, device="cpu", dw_gemm="one_kernel")
    case = "cudarl joined (agent axis), one-kernel dW, FP32"
    sizes = _by_size(rows, case)
    assert sorted(got) == sorted(sizes) == [1, 3]
    assert not [r for r in rows if r["case"] != case]
    for metrics in sizes.values():
        assert {m: r["unit"] for m, r in metrics.items()} == JOINED_ROWS
        assert metrics["weight gradients (net.dw_gemm)"]["value"] == "one_kernel: one batched GEMM a layer"
        assert metrics["every member's loss finite"]["value"] is True
    assert sorted(extra["joined_onekernel_fp32"]["step_us"]) == [1, 3] and "joined_fp32" not in extra
    dw = bj.dw_rows("FP32", {1: 30.0, 64: 3000.0}, {64: 1500.0, 8: 5.0})
    assert [(r["case"], r["metric"], r["value"]) for r in dw] == [
        ("cudarl joined, one-kernel dW vs split-K dW, FP32", "P=64: speed-up (split-K dW / one-kernel dW)", 2.0)
    ]


def test_joined_probe_arm_rows_on_numpy(monkeypatch):
    """The joined-probe arm: net.batched_algo = "probe" with one-kernel dW, cases and JSON of their own, a
    row counting the batched plans on another algorithm (none on NumPy, which makes no plan) and a row per
    plan from blas.batched_plan_info (here a fake record), and its speed-up over the joined-onekernel arm;
    opt-in (not among the default arms)."""
    from cudarl import blas

    rows, extra = [], {}
    args = argparse.Namespace(repeats=1, profile=None)
    got = bj.joined_arm(False, (3,), args, rows, extra, None, device="cpu", dw_gemm="one_kernel", batched_algo="probe")
    case = "cudarl joined (agent axis), one-kernel dW, probed batched algorithms, FP32"
    sizes = _by_size(rows, case)
    assert sorted(got) == sorted(sizes) == [3]
    want = {**JOINED_ROWS, "batched plans on another algorithm": "", "probe verdicts recalled from disk": ""}
    assert {m: r["unit"] for m, r in sizes[3].items()} == want
    assert sizes[3]["batched plans on another algorithm"]["value"] == "0 of 0"
    assert sizes[3]["probe verdicts recalled from disk"]["value"] == "0 of 0"
    assert extra["joined_probe_fp32"]["batched_plans"] == {3: []} and "joined_onekernel_fp32" not in extra
    algo = {"algo_id": 21, "tile_name": "64x64"}
    probes = [{"algo_id": 21, "tile_name": "256x128", "stages": 3, "equal": False, "us": None},
              {"algo_id": 21, "tile_name": "128x128", "stages": 3, "equal": True, "us": 7.25},
              {"algo_id": 21, "tile_name": "128x64", "stages": 3, "equal": True, "us": 9.5}]  # fmt: skip
    record = {"mode": "probe", "batch": 3, "tf32": False, "changed": True, "probed": 3, "candidates": 8,
              "shape": "[512x256] x [256x256]", "epilogue": 6, "single": algo, "equal": [False, True, True],
              "probes": probes, "single_us": 12.0, "chosen_index": 1,
              "chosen": {**algo, "tile_name": "128x128"}, "cached": False}  # fmt: skip
    kept = {**record, "shape": "[512x13] x [13x256]", "changed": False, "chosen": algo, "chosen_index": None,
            "cached": True, "single_us": 5.0, "probes": [{**probes[1], "us": 6.0}], "probed": 1,
            "equal": [True]}  # fmt: skip
    none_equal = {**kept, "shape": "[512x256] x [256x204]", "single_us": None, "probes": [probes[0]],
                  "equal": [False]}  # fmt: skip
    monkeypatch.setattr(blas, "batched_plan_info", lambda: {("a",): record, ("b",): kept, ("c",): none_equal})
    ext: dict = {}
    extra_rows = bj.probe_rows(case, 3, False, ext)
    assert [(r["metric"], r["value"]) for r in extra_rows] == [
        ("P=3: batched plans on another algorithm", "1 of 3"),
        ("P=3: probe verdicts recalled from disk", "2 of 3"),
        (
            "P=3: batched plan [512x256] x [256x256] epilogue 6",
            "64x64 (algo 21) -> 128x128 (algo 21), 3 probed of 8; us: single 12.0, 256x128 !=, 128x128 7.2*, "
            "128x64 9.5",
        ),
        (
            "P=3: batched plan [512x13] x [13x256] epilogue 6",
            "64x64 (algo 21) -> 64x64 (algo 21): kept, 1 probed of 8; us: single 5.0*, 128x128 6.0",
        ),
        (
            "P=3: batched plan [512x256] x [256x204] epilogue 6",
            "64x64 (algo 21) -> 64x64 (algo 21): kept, 1 probed of 8, none bitwise equal",
        ),
    ]
    assert ext["batched_plans"] == {3: [record, kept, none_equal]}
    vs = bj.probe_vs_rows("FP32", {64: 3000.0, 8: 1.0}, {64: 1500.0})
    assert [(r["case"], r["metric"], r["value"]) for r in vs] == [
        (
            "cudarl joined, probed vs single batched algorithms, FP32",
            "P=64: speed-up (single / probed batched algorithms)",
            2.0,
        )
    ]
    assert "joined-probe" in bp.ARMS and "joined-probe" not in bp.DEFAULT_ARMS
    assert bp._arms("joined-onekernel,joined-probe") == ("joined-onekernel", "joined-probe")
    with pytest.raises(ValueError, match="no arm of dw_gemm 'split_k' and batched_algo 'probe'"):
        bj.joined_arm(False, (1,), args, [], {}, None, device="cpu", batched_algo="probe")


@pytest.mark.parametrize("forms", ["one", "two"])
def test_joined_arm_forms_flag_forces_the_form(forms):
    """--forms one|two: every size takes that form of the loss and the optimiser, and its rows say so."""
    rows, extra = [], {}
    args = argparse.Namespace(repeats=1, profile=None, forms=forms)
    bj.joined_arm(False, (1, 3), args, rows, extra, None, device="cpu")
    one = ("one launch (grid barrier)", "one launch (grid barrier)")
    two = ("two launches (no grid barrier)", "two launches (norm and publish; update)")
    got = {P: (m["loss"]["value"], m["optimiser"]["value"]) for P, m in _by_size(rows).items()}
    assert got == {P: one if forms == "one" else two for P in (1, 3)}


def test_joined_arm_rows_say_which_form_ran(monkeypatch):
    """The loss's and the optimiser's rows name the form the learner took: on a device of 3 resident
    blocks (the learner's limit patched; NumPy runs either form), P = 1 takes both one launches and P = 3
    (one block a member, fewer than alone) the barrier-free forms; --profile's phase rows beside them."""
    from cudarl.stacked_agent import StackedLearner

    forms = StackedLearner.one_launch_forms
    monkeypatch.setattr(StackedLearner, "one_launch_forms", lambda self, limit=None: forms(self, limit or 3))
    rows, extra = [], {}
    bj.joined_arm(False, (1, 3), argparse.Namespace(repeats=1, profile=(3,)), rows, extra, None, device="cpu")
    sizes = _by_size(rows)
    got = {P: (m["loss"]["value"], m["optimiser"]["value"]) for P, m in sizes.items()}
    one = "one launch (grid barrier)"
    two = ("two launches (no grid barrier)", "two launches (norm and publish; update)")
    assert got == {1: (one, one), 3: two}
    assert extra["joined_fp32"]["one_launch"][3] == {"targets_loss": False, "adam": False}
    assert all(m["every member's loss finite"]["value"] is True for m in sizes.values())
    phases = {m.removeprefix("phase ") for m in sizes[3] if m.startswith("phase ")}
    assert {"targets_loss", "adam"} <= phases and not any(m.startswith("phase ") for m in sizes[1])


def test_joined_arm_records_a_refusal_as_rows(monkeypatch):
    """A config the learner refuses (CQL: not the reference step) is a row per form, with the reason."""
    config = bj.joined_config
    monkeypatch.setattr(bj, "joined_config", lambda *a: config(*a, agent={"cql_alpha": 0.1}))
    rows, extra = [], {}
    got = bj.joined_arm(False, (2,), argparse.Namespace(repeats=1, profile=None), rows, extra, None, device="cpu")
    assert got == {}
    refused = [(r["case"], r["metric"], r["value"]) for r in rows]
    assert [(c, m) for c, m, _ in refused] == [(CASE, "P=2: step"), (f"{CASE}, run.grid_barrier = false", "P=2: step")]
    assert all(v.startswith("refused: ") and "reference" in v for _, _, v in refused)
    assert sorted(extra["joined_fp32"]["refused"]) == ["2", "2, grid barrier off"]


def test_ratio_rows_against_the_other_arms():
    rows = bj.ratio_rows("FP32", {1: 10.0, 64: 100.0}, {64: 300.0}, {64: 400.0}, 20.0)
    got = {(r["case"], r["metric"]): (r["value"], r["unit"], r["target"]) for r in rows}
    assert got == {
        ("cudarl joined vs the single agent, FP32", "P=1: speed-up (P x single / joined)"): (2.0, "x", ""),
        ("cudarl joined vs branches, FP32", "P=64: speed-up (branches / joined)"): (3.0, "x", ""),
        ("cudarl joined vs PyTorch vmap, FP32", "P=64: speed-up (vmap / joined)"): (4.0, "x", ">= 2.5x"),
        ("cudarl joined vs the single agent, FP32", "P=64: speed-up (P x single / joined)"): (12.8, "x", ""),
    }
    tf32 = bj.ratio_rows("TF32", {64: 100.0}, {}, {64: 400.0}, None)
    assert [(r["metric"], r["target"]) for r in tf32] == [("P=64: speed-up (vmap / joined)", "")]
    one = bj.ratio_rows("FP32", {64: 100.0}, {64: 300.0}, {}, None, "one-kernel dW")
    assert [r["case"] for r in one] == ["cudarl joined, one-kernel dW vs branches, FP32"]


def test_bench_population_cpu_runs_the_joined_arm(tmp_path):
    out = tmp_path / "pop.json"
    cmd = [sys.executable, str(ROOT / "tools" / "bench_population.py"), "--device", "cpu", "--repeats", "1"]
    r = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(out.read_text())
    assert rep["benchmark"] == "bench_population" and rep["arms"] == ["joined", "joined-onekernel"]
    sizes = _by_size(rep["rows"])
    assert sorted(sizes) == list(bj.CPU_SIZES)
    assert all({m: x["unit"] for m, x in metrics.items()} == JOINED_ROWS for metrics in sizes.values())
    assert {(x["case"], x["value"]) for x in rep["rows"] if x["metric"] == "skipped"} == {
        ("branches", "GPU only"),
        ("vmap", "GPU only"),
    }
    assert np.isfinite(rep["joined_fp32"]["step_us"]["1"])
    bad = subprocess.run([*cmd, "--arms", "joined,bogus"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert bad.returncode == 2 and "arms" in bad.stderr


@pytest.mark.parametrize("text", ["joined", "vmap,joined", "joined,joined,branches", "joined,joined-onekernel"])
def test_arms_option(text):
    got = bp._arms(text)
    assert set(got) <= set(bp.ARMS) and len(got) == len(set(got))


def test_sweep_scaling_arm_on_two_cpu_workers(tmp_path):
    """The sweep-scaling arm (issue 21, point 2) at a tiny size: one spec swept on a local Ray with 1 and with 2
    CPU workers; its rows, a finite positive efficiency, and the same numbers per trial in both sweep.csv."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install 'cudarl[cluster]')")
    import sweep_scaling as bs

    assert "sweep-scaling" in bp.ARMS and "sweep-scaling" not in bp.DEFAULT_ARMS  # opt-in
    rows, extra = [], {}
    ext = bs.sweep_scaling_arm(2, False, rows, extra, trials=4, steps=20, out_dir=tmp_path)
    assert extra["sweep_scaling"] is ext and not [r for r in rows if r["metric"] in ("failed", "skipped")]
    got = {(r["case"], r["metric"]): r["value"] for r in rows}
    for n in (1, 2):
        c = f"{bs.CASE}, {n} CPU (NumPy backend) worker(s)"
        assert got[(c, "trials")] == 4
        assert got[(c, "wall (submit -> all trials recorded)")] > 0
        assert got[(c, "trials per hour")] == pytest.approx(3600 * 4 / got[(c, "wall (submit -> all trials recorded)")])
        run = ext["runs"][str(n)]
        assert run["workers"] == n and sum(run["populations"]) == 4 and len(run["populations_per_worker"]) == n
        assert run["retried"] == 0 and 0 < run["utilisation"] <= 1
    eff = got[(bs.CASE, "scaling efficiency (speed-up / 2)")]
    assert np.isfinite(eff) and eff > 0 and eff == pytest.approx(got[(bs.CASE, "speed-up, 2 over 1 worker")] / 2)
    assert got[(bs.CASE, "trials equal at 1 and at G workers")] is True
    assert got[(bs.CASE, "per-trial numbers identical (sweep.csv by key)")] is True and ext["differing"] == {}
    # the two sweep.csv files themselves: every trial once, the same numbers by key (not where it ran)
    a, b = ({r["key"]: r for r in csv.DictReader((tmp_path / f"workers-{n}" / "sweep.csv").open())} for n in (1, 2))
    assert len(a) == 4 and sorted(a) == sorted(b)
    for k in a:
        keep = [c for c in a[k] if c not in bs.PLACEMENT_COLUMNS]
        assert [a[k][c] for c in keep] == [b[k][c] for c in keep], k
        assert a[k]["val_sharpe"] and a[k]["weights_sha256"]
    # the packing: one population of 4 on one worker; two of 2 on two workers, one each (no idle worker)
    assert ext["runs"]["1"]["populations"] == [4] and ext["runs"]["2"]["populations"] == [2, 2]
    assert ext["runs"]["2"]["populations_per_worker"] == [1, 1]
