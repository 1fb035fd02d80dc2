"""cudarl-train train / evaluate / config / info: the main job from the command line, on the CPU."""

import json
import pickle
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from cudarl.cli import app, build_config
from cudarl.config import Config, from_dict, resolve_for_backend, tomllib

runner = CliRunner()


def test_cli_defaults_are_the_configs():
    cfg, explicit = build_config(device="cpu")
    assert explicit == {"run": {"device": "cpu"}}
    assert cfg == resolve_for_backend(from_dict({"run": {"device": "cpu"}}), False, explicit)
    printed = runner.invoke(app, ["config", "--device", "gpu"])
    assert printed.exit_code == 0
    assert from_dict(tomllib.loads(printed.stdout)) == Config()  # `config` prints exactly the defaults
    printed = runner.invoke(app, ["config", "--device", "cpu"])
    assert from_dict(tomllib.loads(printed.stdout)) == resolve_for_backend(Config(), False, {})


@pytest.mark.parametrize("encoder", ["mlp", "ssm", "attention"])
def test_train_and_evaluate_with_each_encoder(tmp_path, encoder):
    """A small run of each encoder over an 8-bar window from the command line, then its policy file
    evaluated on the test split (the policy gathers the same windows)."""
    sets = [f"net.encoder={encoder}", "net.window=8", "net.d_model=8", "net.ssm_headdim=8", "net.ssm_state=8"]
    sets += ["env.episode_len=64", "run.eval_every=20"]
    args = ["train", "builtin:regime?n=1200", "--steps", "20", "--device", "cpu", "--out", str(tmp_path)]
    r = runner.invoke(app, args + [x for s in sets for x in ("--set", s)])
    assert r.exit_code == 0, r.output
    (run,) = tmp_path.iterdir()
    assert tomllib.loads((run / "config.toml").read_text())["net"]["encoder"] == encoder
    r = runner.invoke(app, ["evaluate", str(run / "checkpoints" / "best.safetensors"), "--split", "test"])
    assert r.exit_code == 0, r.output
    summary = json.loads(next((run / "eval").glob("test-*/summary.json")).read_text())
    assert summary["split"]["name"] == "test" and summary["step"] == 20


def test_flags_files_and_sets_layer_in_order(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[agent]\ngamma = 0.9\nbatch_size = 32\n[run]\nsteps = 7\n")
    cfg, explicit = build_config("builtin:randomwalk", f, ["agent.gamma=0.8"], steps=9, device="cpu")
    assert cfg.agent.gamma == 0.8 and cfg.agent.batch_size == 32 and cfg.run.steps == 9
    assert cfg.data.source == "builtin:randomwalk"
    assert cfg.env.n_envs == 16  # CPU scale-down of a field the user did not set
    cfg2, _ = build_config(device="cpu", sets=["env.n_envs=4"])
    assert cfg2.env.n_envs == 4  # ... and never of one they did


def test_train_writes_the_run_directory_in_under_60_s(tmp_path):
    t0 = time.perf_counter()
    r = runner.invoke(
        app,
        [
            "train",
            "builtin:regime",
            "--steps",
            "80",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
            "--set",
            "run.eval_every=40",
            "--set",
            "run.checkpoint_every=40",
        ],
    )
    elapsed = time.perf_counter() - t0
    assert r.exit_code == 0, r.output
    assert elapsed < 60
    (run,) = tmp_path.iterdir()
    for f in (
        "config.toml",
        "env.json",
        "data_report.json",
        "metrics.jsonl",
        "metrics.csv",
        "checkpoints/latest.npz",
        "checkpoints/step-00000040.safetensors",
        "checkpoints/best.safetensors",
        "eval/val-00000080/summary.json",
        "eval/val-00000080/equity.csv",
        "eval/val-00000080/trades.csv",
    ):
        assert (run / f).is_file(), f
    assert json.loads((run / "env.json").read_text())["backend"] == "numpy"
    # evaluate the checkpoint on the test split
    r = runner.invoke(app, ["evaluate", str(run / "checkpoints" / "latest.npz"), "--split", "test"])
    assert r.exit_code == 0, r.output
    assert (run / "eval" / "test-00000080" / "summary.json").is_file()
    # resume and extend
    r = runner.invoke(app, ["train", "--resume", str(run / "checkpoints" / "latest.npz"), "--steps", "100"])
    assert r.exit_code == 0, r.output
    assert "resumed from" in r.output and (run / "eval" / "val-00000100").is_dir()


def test_a_malicious_pickle_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    bad = tmp_path / "latest.npz"
    bad.write_bytes(pickle.dumps(Evil()))
    r = runner.invoke(app, ["train", "--resume", str(bad)])
    assert r.exit_code != 0 and "not a cudarl checkpoint" in r.output
    r = runner.invoke(app, ["evaluate", str(bad)])
    assert r.exit_code != 0 and "not a cudarl checkpoint" in r.output
    assert not marker.exists()


def test_errors_are_one_line_without_traceback():
    r = subprocess.run(
        [sys.executable, "-m", "cudarl.cli", "train", "/no/such/bars.csv", "--device", "cpu"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0
    assert r.stderr.strip().splitlines() == ["cudarl-train: error: /no/such/bars.csv: file not found"]
    r = subprocess.run(
        [sys.executable, "-m", "cudarl.cli", "train", "--device", "cpu", "--set", "agent.gamma=2"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr and "gamma must be in [0, 1]" in r.stderr


def test_info_names_the_backend():
    r = runner.invoke(app, ["info"])
    assert r.exit_code == 0 and "backend:" in r.output and "kernel families:" in r.output and "replay" in r.output
