"""``tools/bench_step.py --aux``: issue 19's auxiliary-signal arms (``tools/bench_aux.py``'s
:func:`run_arms`, not a copy) in bench_step's table and JSON, on the NumPy backend at the reference
workload (the rows' names and units; no timing is asserted); without a GPU the flag writes a skip row."""

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench_aux as ba  # noqa: E402
import bench_step as bs  # noqa: E402

from cudarl.backend import cupy_unavailable_reason  # noqa: E402


def test_bench_steps_aux_arms_are_bench_aux_arms_on_numpy():
    rows, extra = [], {}
    bs.aux_arms(argparse.Namespace(repeats=1), rows, extra, device="cpu")
    assert not [r for r in rows if r["metric"] == "failed"]
    steps = {r["case"]: r for r in rows if r["metric"] == ba.TRAIN}
    assert set(steps) == {f"mlp, aux {arm}" for arm in ba.ARMS}  # every arm, the (whole) ones too
    assert all(r["unit"] == "us" and r["value"] > 0 for r in steps.values())
    shares = {r["case"]: r for r in rows if r["metric"] == "added, share of the step"}
    assert set(shares) == {f"mlp, aux {a}" for a, (_, against, _) in ba.ARMS.items() if against == "none"}
    assert shares["mlp, aux all"]["target"] == "<= 40%" and all(r["unit"] == "%" for r in shares.values())
    assert extra["aux"]["encoder"] == "mlp" and extra["aux"]["whole"] == ba.WHOLE


@pytest.mark.skipif(cupy_unavailable_reason() is None, reason="a GPU would run every arm of bench_step")
def test_bench_step_without_a_gpu_says_the_aux_arms_were_skipped(tmp_path):
    out = tmp_path / "bench_step.json"
    flags = ["--aux", "--no-torch", "--no-encoders", "--no-net-variants", "--no-dw-variants"]
    subprocess.run([sys.executable, str(ROOT / "tools" / "bench_step.py"), *flags, "--out", str(out)], check=True)
    rows = json.loads(out.read_text())["rows"]
    assert [r["metric"] for r in rows if r["case"] == "aux signals"] == ["skipped"]


def test_the_arms_flag_picks_arms_and_the_ablation_removes_one_signal_each():
    """``--arms``: the named arms and none; ``ablation``: all seven and each "all but <s>", whose row says what
    ``s`` costs inside all seven; ``--aux-gemm`` reaches the arms' configs (NumPy: no timing asserted)."""
    assert set(ba.ABLATION) == {f"all but {s}" for s in ba.ARMS["all"][0]}
    assert all(len(sig) == len(ba.ARMS["all"][0]) - 1 for sig, _, _ in ba.ABLATION.values())
    rows, meta = ba.run_arms("mlp", "cpu", repeats=1, whole=False, only=("causal",), aux_gemm="cudarl")
    assert {r["case"] for r in rows if r["metric"] == ba.TRAIN} == {"mlp, aux none", "mlp, aux causal"}
    assert meta["aux_gemm"] == "cudarl"
    rows, _ = ba.run_arms("mlp", "cpu", repeats=1, whole=False, only=("ablation",))
    steps = {r["case"]: r["value"] for r in rows if r["metric"] == ba.TRAIN}
    assert set(steps) == {"mlp, aux none", "mlp, aux all", *(f"mlp, aux {a}" for a in ba.ABLATION)}
    removed = {r["case"]: r["value"] for r in rows if r["metric"] == "removed from all seven"}
    assert removed == {f"mlp, aux {a}": steps["mlp, aux all"] - steps[f"mlp, aux {a}"] for a in ba.ABLATION}


def test_rounds_interleave_the_arms_and_report_medians_and_each_rounds_share(monkeypatch):
    """``--rounds``: every arm once a round, in the same order; an arm's row is its median over the rounds, and
    the share of an arm measured against none is also given per round (that round's arm over that round's
    none), its least and greatest (the timings come from a stub here: the arithmetic, not a GPU's)."""
    import cudarl.bench as bench

    times = iter([100.0, 150.0, 110.0, 140.0, 90.0, 130.0])  # none, all per round
    calls = []

    def fake(repeats, device, cfg, phases, label):
        calls.append(label.strip())
        return [{"metric": ba.TRAIN, "value": next(times)}]

    monkeypatch.setattr(bench, "step_benchmark", fake)
    rows, meta = ba.run_arms("mlp", "cpu", repeats=1, whole=False, only=("all",), rounds=3)
    assert calls == ["aux none", "aux all"] * 3 and meta["rounds"] == 3
    steps = {r["case"]: r["value"] for r in rows if r["metric"] == ba.TRAIN}
    assert steps == {"mlp, aux none": 100.0, "mlp, aux all": 140.0}  # the medians
    got = {r["metric"]: r["value"] for r in rows if r["case"] == "mlp, aux all"}
    assert got["added, share of the step"] == pytest.approx(40.0)  # the medians' share
    assert got["added, share of the step, least over the rounds"] == pytest.approx(100 * 30 / 110)
    assert got["added, share of the step, greatest over the rounds"] == pytest.approx(100 * 50 / 100)
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        ba.run_arms("mlp", "cpu", repeats=1, whole=False, only=("all",), rounds=0)
