"""Learning-check runs that survive being cut (tools/run_dirs.py, ``learning_check.run_jobs``): each job
writes a run directory named from the job; a signal makes every running job save its checkpoint; a
later call with ``--resume`` continues from it, and its row is the uninterrupted run's, bit for bit;
the best-validation weights get their own test view."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import learning_check  # noqa: E402
import run_dirs  # noqa: E402

from cudarl.evaluate import json_safe  # noqa: E402
from cudarl.trainer import Trainer  # noqa: E402

#: Fields that differ between two calls of the same run by design.
CALL_FIELDS = ("wall_s", "train_s", "run_dir", "resumed_from")


def _tiny(monkeypatch, steps=60, eval_every=20):
    """The ``regime`` task and the CPU budget cut to about a second a run."""
    task = {**learning_check.TASKS["regime"], "config": {"data": {"source": "builtin:regime?n=1500"}}}
    monkeypatch.setitem(learning_check.TASKS, "regime", task)
    tiny = {"run": {"steps": steps, "eval_every": eval_every}, "env": {"n_envs": 8, "episode_len": 128}}
    tiny["agent"] = {"batch_size": 32, "learning_starts": 200}
    tiny["replay"] = {"capacity": 4096}
    monkeypatch.setattr(learning_check, "QUICK", tiny)


def _job(**kw):
    return {"task": "regime", "head": "c51", "seed": 0, "device": "cpu", "quick": True, "sets": [], **kw}


def _result(row: dict) -> dict:
    """The row as written (strict JSON), less what differs between calls."""
    return json_safe({k: v for k, v in row.items() if k not in CALL_FIELDS})


def _sigterm_at(monkeypatch, step: int):
    """Make this process send itself SIGTERM right after learner update ``step``."""
    own = Trainer._update

    def update(self):
        own(self)
        if self.step == step:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Trainer, "_update", update)


def test_run_dir_names_are_stable_and_name_what_makes_the_config():
    job = _job(variant="lr 3e-4", sets=["optim.lr=3e-4"])
    assert run_dirs.name(job) == run_dirs.name(dict(job))
    assert run_dirs.name(job).startswith("regime-c51-seed0-lr_3e-4-")
    # the name is a function of the job's content, the same in any process (no salted hash)
    code = (
        "import sys; sys.path.insert(0, 'tools'); import run_dirs, json; print(run_dirs.name(json.loads(sys.argv[1])))"
    )
    out = subprocess.run([sys.executable, "-c", code, json.dumps(job)], cwd=ROOT, capture_output=True, text=True)
    assert out.stdout.strip() == run_dirs.name(job), out.stderr
    others = [_job(seed=1), _job(sets=["optim.lr=1e-3"]), _job(quick=False), _job(device="gpu"), _job(head="iqn")]
    names = {run_dirs.name(j) for j in [_job(), *others]}
    assert len(names) == 1 + len(others)
    assert run_dirs.name({**_job(), "mechanism": "a label", "resume": True}) == run_dirs.name(_job())


@pytest.mark.parametrize("cut_at", [30, 40, 60])  # between evaluations, at one, at the last update
def test_a_job_cut_by_sigterm_resumes_to_the_uninterrupted_row(tmp_path, monkeypatch, cut_at, capsys):
    _tiny(monkeypatch)
    whole: list = []
    learning_check.run_jobs([_job()], 1, whole.append, run_root=tmp_path / "a")
    with monkeypatch.context() as m:
        _sigterm_at(m, cut_at)
        cut: list = []
        with pytest.raises(learning_check.interrupt.Interrupted) as stopped:
            learning_check.run_jobs([_job()], 1, cut.append, run_root=tmp_path / "b")
    assert cut == [] and stopped.value.exit_code == 143 and "--resume" in str(stopped.value)
    d = tmp_path / "b" / run_dirs.name(_job())
    assert run_dirs.checkpoint_step(d / run_dirs.LATEST) == cut_at
    resumed: list = []
    learning_check.run_jobs([_job()], 1, resumed.append, run_root=tmp_path / "b", resume=True)
    assert f"resume: {d.name} from update {cut_at}" in capsys.readouterr().out
    assert resumed[0]["resumed_from"] == cut_at and resumed[0]["run_dir"] == str(d)
    assert _result(resumed[0]) == _result(whole[0])
    assert [s for s, _ in resumed[0]["val_history"]] == [20, 40, 60]


def test_an_existing_run_dir_is_continued_only_with_resume(tmp_path, monkeypatch):
    _tiny(monkeypatch)
    rows: list = []
    learning_check.run_jobs([_job()], 1, rows.append, run_root=tmp_path)
    with pytest.raises(SystemExit, match="--resume"):
        learning_check.run_jobs([_job()], 1, rows.append, run_root=tmp_path)
    # its checkpoint continues under a config that differs only in how the run is launched (workers
    # sharing a GPU turn run.grid_barrier off: the same bits), never under another config
    from dataclasses import replace

    from cudarl import checkpoint as ckpt
    from cudarl.config import from_dict

    done = tmp_path / run_dirs.name(_job())
    cfg = from_dict(ckpt.load(done / run_dirs.LATEST, only=("trainer/",))[1]["config"])
    t, at = run_dirs.open_trainer(replace(cfg, run=replace(cfg.run, grid_barrier=False)), done, True, print)
    assert at == 60 and t.cfg.run.grid_barrier is False
    with pytest.raises(ValueError, match="optim.lr"):
        run_dirs.open_trainer(replace(cfg, optim=replace(cfg.optim, lr=1e-2)), done, True, print)
    # a directory a killed start left without a checkpoint is started over
    bare = tmp_path / run_dirs.name(_job(seed=1))
    from cudarl import rundir

    rundir.claim(bare)
    learning_check.run_jobs([_job(seed=1)], 1, rows.append, run_root=tmp_path, resume=True)
    assert rows[-1]["error"] is None and rows[-1]["resumed_from"] is None
    assert run_dirs.checkpoint_step(bare / run_dirs.LATEST) == 60


def test_the_best_validation_view_is_the_last_weights_when_the_last_evaluation_is_the_best(tmp_path, monkeypatch):
    """One validation evaluation (at the last update): the best weights are the last, so their test view
    is the headline margin's view; with several, it names the update validation chose."""
    _tiny(monkeypatch, eval_every=60)
    rows: list = []
    learning_check.run_jobs([_job()], 1, rows.append, run_root=tmp_path)
    views = rows[0]["views"]
    best = views[learning_check.BEST_VIEW]
    assert best["step"] == 60 and best["val_sharpe"] == rows[0]["val_best"]
    assert {k: v for k, v in best.items() if k not in ("step", "val_sharpe")} == views["margin=0"]
    _tiny(monkeypatch, eval_every=20)
    learning_check.run_jobs([_job(seed=1)], 1, rows.append, run_root=tmp_path)
    best, hist = rows[1]["views"][learning_check.BEST_VIEW], rows[1]["val_history"]
    assert best["val_sharpe"] == max(s for _, s in hist) and (best["step"], best["val_sharpe"]) in map(tuple, hist)
    # the same run without a run directory: no best view, and every other number the same (the
    # headline and the other views are the last weights', whatever the best)
    learning_check.run_jobs([_job(seed=1)], 1, rows.append)
    assert learning_check.BEST_VIEW not in rows[2]["views"]
    import learning_report

    assert f"`{learning_check.BEST_VIEW}`" in learning_report.view_lines([json_safe(r) for r in rows])[0]
    del rows[1]["views"][learning_check.BEST_VIEW]
    assert _result(rows[1]) == _result(rows[2])


@pytest.mark.slow
def test_a_sweep_killed_like_timeout_saves_in_its_workers_and_resumes_to_the_same_rows(tmp_path):
    """tools/sweep.py with two worker processes, SIGTERM to its process group (what ``timeout`` sends):
    the workers save and the parent waits for them; ``--resume`` then finishes both runs, and their rows
    equal an uninterrupted sweep's."""
    cmd = [sys.executable, "tools/sweep.py", "--tasks", "canary", "--device", "cpu", "--quick", "--workers", "2"]
    cmd += ["--seeds", "2"] + [f"--set={s}" for s in ("run.steps=1500", "run.eval_every=100", "env.n_envs=8")]
    cmd += ["--set=agent.batch_size=32", "--set=replay.capacity=8192"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def sweep(name, *more, **kw):
        args = [*cmd, "--jsonl", str(tmp_path / f"{name}.jsonl"), "--run-root", str(tmp_path / name), *more]
        return subprocess.Popen(
            args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw
        )

    p = sweep("cut", start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:  # both runs past their first validation evaluation
            logs = list((tmp_path / "cut").glob("*/metrics.jsonl"))
            if len(logs) == 2 and all('"eval"' in f.read_text() for f in logs):
                break
            time.sleep(0.2)
        os.killpg(p.pid, signal.SIGTERM)
        out, _ = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 143, out
    assert out.count("cut short:") == 2 and "latest.npz" in out, out
    assert not (tmp_path / "cut.jsonl").exists() or not (tmp_path / "cut.jsonl").read_text().strip()
    steps = [run_dirs.checkpoint_step(d / run_dirs.LATEST) for d in sorted((tmp_path / "cut").iterdir())]
    assert all(100 <= s < 1500 for s in steps), steps
    q = sweep("cut", "--resume")
    out, _ = q.communicate(timeout=300)
    assert q.returncode == 0, out
    assert out.count("resume: canary-c51-seed") == 2, out
    r = sweep("whole")
    assert r.communicate(timeout=300)[0] and r.returncode == 0

    def rows(name):
        got = [json.loads(x) for x in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        return {x["seed"]: x for x in got}

    cut, whole = rows("cut"), rows("whole")
    assert sorted(x["resumed_from"] for x in cut.values()) == sorted(steps)
    assert {s: _result(x) for s, x in cut.items()} == {s: _result(x) for s, x in whole.items()}
