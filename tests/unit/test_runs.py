"""Runs that never lose work (issue 16, points 1-6): run directories, resume, metrics, interrupts,
file modes and poisoned checkpoints. Each test reproduces a defect of b682a3c first."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from test_trainer import small

from cudarl import checkpoint as ckpt
from cudarl.trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def quiet(m):
    pass


def snapshot(d: Path) -> dict:
    """Every file under ``d``: (bytes, mtime_ns, inode), to see that nothing was written."""
    return {
        str(p.relative_to(d)): (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino)
        for p in sorted(d.rglob("*"))
        if p.is_file()
    }


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- 1. resume writes only into a run directory cudarl made, never over a better best ------------------
def test_resume_from_an_older_checkpoint_continues_in_a_new_run_directory(tmp_path):
    cfg = small(tmp_path / "runs", run={"eval_every": 20, "steps": 100})
    t = Trainer(cfg, echo=quiet)
    t.run(40)
    old = t.run_dir / "checkpoints" / "keep-40.npz"
    shutil.copyfile(t.run_dir / "checkpoints" / "latest.npz", old)
    t.run(100)
    before = snapshot(t.run_dir)
    said = []
    r = Trainer.resume(old, echo=said.append)
    assert r.step == 40 and r.run_dir != t.run_dir and r.run_dir.parent == t.run_dir.parent
    assert any("new run directory" in m and str(r.run_dir) in m for m in said), said
    r.run(80)
    assert snapshot(t.run_dir) == before  # the first run's best, metrics, config: untouched


def test_a_resumed_run_has_the_history_of_evaluations_a_run_that_never_stopped_has(tmp_path):
    """The validation Sharpe over training (``Trainer.history``) of a resumed run: read back from the
    metric log up to the checkpoint (in place, in a new directory, and at the last update, whose
    evaluation is made again, not listed twice)."""
    cfg = small(tmp_path / "runs", run={"eval_every": 20, "steps": 100})
    whole = Trainer(cfg, echo=quiet)
    whole.run(100)
    key = [(r["step"], r["sharpe"], r["psr"]) for r in whole.history]
    t = Trainer(cfg, echo=quiet)
    t.run(40)
    keep = t.run_dir / "checkpoints" / "keep-40.npz"
    shutil.copyfile(t.run_dir / "checkpoints" / "latest.npz", keep)
    r = Trainer.resume(t.run_dir / "checkpoints" / "latest.npz", echo=quiet)  # in place
    assert [(x["step"], x["sharpe"], x["psr"]) for x in r.history] == key[:2]
    r.run(100)
    assert [(x["step"], x["sharpe"], x["psr"]) for x in r.history] == key
    again = Trainer.resume(t.run_dir / "checkpoints" / "latest.npz", echo=quiet)  # at the last update
    again.run(100)
    assert [(x["step"], x["sharpe"], x["psr"]) for x in again.history] == key
    older = Trainer.resume(keep, echo=quiet)  # a new run directory
    assert older.run_dir != t.run_dir and [x["step"] for x in older.history] == [20, 40]


def test_resume_from_a_user_folder_writes_nothing_there_even_when_it_fails(tmp_path):
    t = Trainer(small(tmp_path / "runs"), echo=quiet)
    t.run(30)
    proj = tmp_path / "proj"
    (proj / "ckpts").mkdir(parents=True)
    (proj / "config.toml").write_text("mine\n")
    (proj / "env.json").write_text("{}\n")
    shutil.copyfile(t.run_dir / "checkpoints" / "latest.npz", proj / "ckpts" / "m.npz")
    before, runs_before = snapshot(proj), sorted(p.name for p in (tmp_path / "runs").iterdir())
    with pytest.raises(Exception, match="layout|hidden|shape"):
        Trainer.resume(proj / "ckpts" / "m.npz", overrides={"net": {"hidden": [16]}}, echo=quiet)
    assert snapshot(proj) == before
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == runs_before  # no half-made run directory
    r = Trainer.resume(proj / "ckpts" / "m.npz", echo=quiet)
    r.run(40)
    assert snapshot(proj) == before and r.run_dir.parent == tmp_path / "runs"


def test_resume_never_replaces_a_better_best(tmp_path):
    t = Trainer(small(tmp_path / "runs", run={"eval_every": 20, "steps": 100}), echo=quiet)
    t.run(60)
    best = t.run_dir / "checkpoints" / "best.safetensors"
    # a best far better than anything this run reaches, recorded after latest.npz was written
    from cudarl.policy import read_policy_info, save_policy

    save_policy(best, t, best={"step": 60, "sharpe": 99.0})
    r = Trainer.resume(t.run_dir / "checkpoints" / "latest.npz", echo=quiet)
    assert r.run_dir == t.run_dir and r.best["sharpe"] == 99.0
    r.run(100)
    assert read_policy_info(best)["best"]["sharpe"] == 99.0


def test_a_policy_file_cannot_be_resumed_and_says_what_can(tmp_path):
    t = Trainer(small(tmp_path / "runs", run={"eval_every": 20}), echo=quiet)
    t.run(40)
    with pytest.raises(ckpt.CheckpointError, match="latest.npz"):
        Trainer.resume(t.run_dir / "checkpoints" / "best.safetensors", echo=quiet)


# --- 2. run directories are created exclusively --------------------------------------------------------
def test_two_runs_in_the_same_second_get_two_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(time, "strftime", lambda *a, **k: "20250101-000000")
    cfg = small(tmp_path / "runs")
    a, b = Trainer(cfg, echo=quiet), Trainer(cfg, echo=quiet)
    assert a.run_dir != b.run_dir
    assert a.run_dir.name == "cudarl-20250101-000000-0" and b.run_dir.name.startswith(a.run_dir.name)
    for t in (a, b):
        assert (t.run_dir / ".cudarl-run").is_file()


def test_an_existing_folder_is_never_reused_as_a_run_directory(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="never reuses"):
        Trainer(small(tmp_path), run_dir=d, echo=quiet)
    used = tmp_path / "used"
    Trainer(small(tmp_path), run_dir=used, echo=quiet)
    with pytest.raises(FileExistsError, match="never reuses"):
        Trainer(small(tmp_path), run_dir=used, echo=quiet)
    assert [p.name for p in d.iterdir()] == ["notes.txt"]


# --- 3. metrics: no duplicated rows after a resume, a torn tail tolerated, the CSV as the run goes ------
def crashed_after(tmp_path, saved: int, reached: int):
    """A run whose latest.npz is at ``saved`` while its metrics went on to ``reached`` (a crash)."""
    t = Trainer(small(tmp_path / "runs", run={"log_every": 10}), echo=quiet)
    t.run(saved)
    latest = t.run_dir / "checkpoints" / "latest.npz"
    keep = latest.read_bytes()
    t.run(reached)
    latest.write_bytes(keep)
    return t


def test_resume_truncates_the_metrics_to_the_resumed_step(tmp_path):
    t = crashed_after(tmp_path, 40, 60)
    r = Trainer.resume(t.run_dir / "checkpoints" / "latest.npz", echo=quiet)
    assert r.run_dir == t.run_dir  # its own latest: continues in place
    r.run(60)
    steps = [x["step"] for x in rows(t.run_dir / "metrics.jsonl") if "loss" in x]
    assert steps == [10, 20, 30, 40, 50, 60]
    csv_steps = [int(line.split(",")[0]) for line in (t.run_dir / "metrics.csv").read_text().splitlines()[1:]]
    assert csv_steps == [10, 20, 30, 40, 50, 60]


def test_a_torn_last_metrics_line_is_tolerated_and_reported_with_the_file(tmp_path):
    t = crashed_after(tmp_path, 40, 50)
    with open(t.run_dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 50, "lo')  # killed mid-write
    said = []
    r = Trainer.resume(t.run_dir / "checkpoints" / "latest.npz", echo=said.append)
    r.run(60)
    assert any("metrics.jsonl" in m and "torn" in m for m in said), said
    assert [x["step"] for x in rows(t.run_dir / "metrics.jsonl") if "loss" in x] == [10, 20, 30, 40, 50, 60]


def test_metrics_csv_is_written_as_the_run_goes(tmp_path):
    t = Trainer(small(tmp_path / "runs", run={"log_every": 10}), echo=quiet)
    seen = []

    def progress(step, row, last_eval):
        p = t.run_dir / "metrics.csv"
        seen.append(len(p.read_text().splitlines()) - 1 if p.exists() else 0)

    t.run(30, progress=progress)
    assert seen[:3] == [1, 2, 3]


# --- 4. Ctrl-C and SIGTERM: a final checkpoint, then 130 / 143; stale temporaries removed -------------
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_writes_a_final_checkpoint_and_exits_128_plus_the_signal(tmp_path, sig, code):
    cmd = [sys.executable, "-m", "cudarl.cli", "train", "builtin:regime?n=1500", "--device", "cpu"]
    cmd += ["--out", str(tmp_path), "--steps", "1000000", "--set", "run.log_every=10", "--set", "run.eval_every=0"]
    cmd += ["--set", "env.n_envs=4", "--set", "env.episode_len=64", "--set", "agent.learning_starts=100"]
    cmd += ["--set", "net.hidden=[16]", "--set", "agent.batch_size=16", "--set", "replay.capacity=2000"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.time() + 60
        metrics = None
        while time.time() < deadline:
            found = list(tmp_path.glob("*/metrics.jsonl"))
            if found and found[0].read_text().count("\n") >= 2:
                metrics = found[0]
                break
            time.sleep(0.1)
        assert metrics is not None, "the run never logged"
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == code, err
    run = metrics.parent
    _, info = ckpt.load(run / "checkpoints" / "latest.npz")
    assert info["step"] >= 20 and "interrupted" in err and "--resume" in err
    assert "Traceback" not in err
    last = rows(metrics)[-1]
    assert last["event"] == "interrupted" and last["step"] == info["step"]


def test_stale_temporaries_of_a_killed_write_are_removed_at_the_next_start(tmp_path):
    t = Trainer(small(tmp_path / "runs"), echo=quiet)
    t.run(30)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = t.run_dir / "checkpoints" / f".latest.npz.{dead.pid}.x1.tmp"
    stale.write_bytes(b"x" * 1000)
    legacy = t.run_dir / "checkpoints" / ".latest.npz.ab12cd.tmp"  # mkstemp's name before this fix
    legacy.write_bytes(b"x")
    live = t.run_dir / "checkpoints" / f".latest.npz.{os.getpid()}.x2.tmp"  # a write in progress
    live.write_bytes(b"x")
    said = []
    Trainer.resume(t.run_dir / "checkpoints" / "latest.npz", echo=said.append)
    assert not stale.exists() and not legacy.exists() and live.exists()
    assert any("temporary" in m for m in said), said


# --- 5. files honour the umask -----------------------------------------------------------------------
def test_files_honour_the_umask(tmp_path):
    from typer.testing import CliRunner

    from cudarl.cli import app

    old = os.umask(0o022)
    try:
        t = Trainer(small(tmp_path / "runs", run={"eval_every": 30, "checkpoint_every": 30}), echo=quiet)
        t.run(30)
        r = CliRunner().invoke(app, ["data", "synth", "regime", str(tmp_path / "synth.csv"), "--n", "50"])
        assert r.exit_code == 0, r.output
    finally:
        os.umask(old)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) > 8
    modes = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    assert set(modes.values()) == {"0o644"}, modes


# --- 6. a checkpoint with NaN weights is refused, naming the tensor ---------------------------------------
def test_nan_weights_are_refused_naming_the_tensor(tmp_path):
    from typer.testing import CliRunner

    from cudarl.cli import app

    t = Trainer(small(tmp_path / "runs"), echo=quiet)
    t.run(30)
    state, info = ckpt.load(t.run_dir / "checkpoints" / "latest.npz")
    p = np.array(state["agent"]["online"]["params"])
    p[7] = np.nan
    state["agent"]["online"]["params"] = p
    bad = tmp_path / "nan.npz"
    ckpt.save(bad, state, info)
    r = CliRunner().invoke(app, ["evaluate", str(bad), "--out", str(tmp_path / "ev")])
    assert r.exit_code == 1 and "not finite" in r.output and "online" in r.output and "enc.0" in r.output, r.output
    assert not (tmp_path / "ev").exists()
    with pytest.raises(ckpt.CheckpointError, match="online"):
        Trainer.resume(bad, echo=quiet)


# --- 12. TensorBoard -----------------------------------------------------------------------------
def test_tensorboard_gets_every_number_of_the_metric_rows(tmp_path):
    pytest.importorskip("tensorboardX", reason="the tensorboard extra is not installed")
    from tensorboardX.event_file_writer import EventFileWriter  # noqa: F401 (the writer this test reads)

    t = Trainer(small(tmp_path / "runs", run={"tensorboard": True, "eval_every": 20, "log_every": 10}), echo=quiet)
    t.run(40)
    t.log.close()
    (events,) = (t.run_dir / "tensorboard").glob("events.out.tfevents.*")
    raw = events.read_bytes()
    for tag in ("train/loss", "train/grad_norm", "train/updates_per_s", "val/sharpe", "val/max_drawdown"):
        assert tag.encode() in raw, tag
    off = Trainer(small(tmp_path / "off"), echo=quiet)
    off.run(20)
    assert not (off.run_dir / "tensorboard").exists()


def test_tensorboard_without_tensorboardx_is_a_config_error(tmp_path, monkeypatch):
    from cudarl.config import ConfigError

    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    with pytest.raises(ConfigError, match=r"cudarl\[tensorboard\]"):
        Trainer(small(tmp_path / "runs", run={"tensorboard": True}), echo=quiet)
    assert not (tmp_path / "runs").exists()  # refused before making a run directory


# --- the README's run-directory table is what a run writes ----------------------------------------------
def readme_patterns() -> list[str]:
    """Glob patterns of the README's run-directory table (its first column)."""
    import re

    text = (ROOT / "README.md").read_text()
    table = text[text.index("| file | what |") :].split("\n\n", 1)[0].splitlines()[2:]
    out = []
    for row in table:
        for name in re.findall(r"`([^`]+)`", row.split("|")[1]):
            name = name.replace("-N", "-*")
            out.append(name + "*" if name.endswith("/") else name)
    return out


def check_run_matches_readme(run: Path) -> None:
    from fnmatch import fnmatch

    pats = readme_patterns()
    files = [str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()]
    unlisted = [f for f in files if not any(fnmatch(f, p) for p in pats)]
    unwritten = [p for p in pats if not any(fnmatch(f, p) for f in files)]
    assert not unlisted, f"written but not in the README's table: {unlisted}"
    assert not unwritten, f"in the README's table but not written: {unwritten}"


def _readme_run(tmp_path, device: str) -> Path:
    from typer.testing import CliRunner

    from cudarl.cli import app

    pytest.importorskip("tensorboardX", reason="the tensorboard extra is not installed")
    pytest.importorskip("matplotlib", reason="equity.png needs matplotlib")
    args = ["train", "builtin:regime?n=1500", "--device", device, "--out", str(tmp_path), "--steps", "40"]
    for s in (
        "run.eval_every=20",
        "run.checkpoint_every=20",
        "run.log_every=10",
        "run.tensorboard=true",
        "env.episode_len=128",
    ):
        args += ["--set", s]
    if device == "cpu":
        args += ["--set", "env.n_envs=8", "--set", "net.hidden=[32,32]", "--set", "agent.learning_starts=200"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    (run,) = tmp_path.iterdir()
    return run


def test_the_readme_table_is_what_a_run_writes(tmp_path):
    check_run_matches_readme(_readme_run(tmp_path, "cpu"))


@pytest.mark.gpu
def test_gpu_the_readme_table_is_what_a_run_writes(tmp_path):
    check_run_matches_readme(_readme_run(tmp_path, "gpu"))
