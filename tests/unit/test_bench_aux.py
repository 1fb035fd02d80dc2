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
