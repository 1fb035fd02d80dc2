"""The benchmarks' checks against the PyTorch twin (tools/bench_step.py's ``step_check``): the reference MLP's
``loss_check`` rows on the NumPy backend, and ``tools/bench_encoders.py --small`` on the CPU writing the
whole-step rows for each windowed encoder; the values within the rows' targets (float32 on both sides).
Skipped without torch (not a test dependency; the GPU host has it)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench_step as bs  # noqa: E402

WHY = "the PyTorch twin needs torch (not a test dependency; the GPU host has it)"
TARGETS = {"loss rel. diff": "<= 1e-5", "KL priority rel. diff": "<= 1e-4", "gradient rel. diff": "<= 1e-4"}


def within_targets(rows, case: str) -> None:
    got = {r["metric"]: r for r in rows if r["case"] == case}
    assert set(got) == set(TARGETS), (case, got)
    for metric, target in TARGETS.items():
        assert got[metric]["target"] == target
        assert 0 <= got[metric]["value"] <= float(target.split()[-1]), got[metric]


def test_bench_step_loss_check_on_numpy():
    pytest.importorskip("torch", reason=WHY)
    rows, extra = [], {}
    bs.loss_check(np, "cpu", rows, extra)
    within_targets(rows, f"check (cudarl numpy vs torch cpu, batch {bs.B})")
    assert set(extra["check"]["grad_rel_diff_by_param"]) == {"enc.0.weight", "enc.0.bias", "enc.1.weight",
                                                             "enc.1.bias", "va.weight", "va.bias"}  # fmt: skip


def test_step_check_refuses_a_step_the_pytorch_one_does_not_compute():
    from cudarl.agent import Agent
    from cudarl.bench import reference_config

    agent = Agent(reference_config("cpu", net={"hidden": [8]}, agent={"batch_size": 4, "popart": True}), 6, 3, 1, np)
    with pytest.raises(ValueError, match="no PopArt"):
        bs.step_check(agent, "cpu")


def test_bench_encoders_small_writes_the_whole_step_check(tmp_path):
    pytest.importorskip("torch", reason=WHY)
    out = tmp_path / "bench_encoders.json"
    cmd = [sys.executable, str(ROOT / "tools" / "bench_encoders.py"), "--small", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT)
    got = json.loads(out.read_text())
    for kind in ("ssm", "attention"):
        within_targets([r for r in got["rows"] if r["metric"] in TARGETS], f"check {kind}")
        assert got["step_check"][kind]["torch"] in ("cpu", "cuda")
