"""A sweep cut mid-population resumes that population from its members' checkpoints (``runs/<key>/``,
Population.resume) and ends with the uncut sweep's sweep.csv and sweep.json rows, bit for bit; a
population it cannot resume starts over and the sweep says why."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from test_sweep import GRID, ledger, runner, write_spec

from cudarl import checkpoint as ckpt
from cudarl.cli import app
from cudarl.interrupt import Interrupted
from cudarl.population import Population
from cudarl.sweep import load_spec
from cudarl.sweep.core import LATEST, RUNS, SweepDir, make_trials, pack, resume_plan

#: updates a trial; the sweep is cut once a member of its second population has logged :data:`CUT`
STEPS, CUT = 100, 30
#: metrics rows every 10 updates, so the test sees the second population training
LOG = '"run.log_every" = 10\n'


def rows_of(d: Path) -> list[dict]:
    return list(csv.DictReader((d / "sweep.csv").open()))


def report_of(d: Path) -> dict:
    """sweep.json less what says how this run of the command went (directory, counts, wall clock)."""
    rep = json.loads((d / "sweep.json").read_text())
    return {k: v for k, v in rep.items() if k not in ("sweep_dir", "trained_now", "skipped_finished",
                                                      "populations_now", "wall_s")}  # fmt: skip


def _logged(metrics: Path, step: int) -> bool:
    for line in metrics.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) >= step:
                return True
        except json.JSONDecodeError:  # a row being written
            pass
    return False


def cut_in_second_population(spec: Path, d: Path) -> subprocess.Popen:
    """``cudarl-train sweep spec --out d`` in a subprocess, sent SIGTERM once the first population is in
    the ledger and a member of the second has logged update :data:`CUT` (its members then write
    ``latest.npz`` at the update they stopped at)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    cmd = [sys.executable, "-m", "cudarl.cli", "sweep", str(spec), "--out", str(d)]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        done = set(ledger(d)) if (d / "trials").is_dir() else set()
        running = [p for p in (d / RUNS).glob("*/metrics.jsonl") if p.parent.name not in done]
        if len(done) == 2 and any(_logged(p, CUT) for p in running):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    return proc


@pytest.mark.parametrize("mode", ["branches", "joined"])
def test_a_sweep_cut_mid_population_resumes_it_to_the_uncut_sweeps_rows(tmp_path, mode):
    """2 configurations x 2 seeds in 2 populations of 2, 100 updates; SIGTERM while the second
    population trains. The same command again skips the first population, resumes the second from its
    members' checkpoints (it says from which update), and writes the sweep.csv and sweep.json rows of
    the sweep never cut, bit for bit (validation and test numbers, weight digests, population indices).
    Branches: a copy of the cut sweep with one member's checkpoint gone starts that population over,
    says why, and ends with the same rows."""
    spec = write_spec(tmp_path, f'"run.population" = "{mode}"\n' + LOG + GRID, steps=STEPS)
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "whole")])
    assert r.exit_code == 0, r.output
    assert "resuming population" not in r.stderr and not (tmp_path / "whole" / RUNS).exists()
    cost = "population 1: a member's resume checkpoint is "  # once a population, with what 2 members write
    assert r.stderr.count(cost) == 1 and "for its 2 member(s) at each validation evaluation and at the end" in r.stderr

    cut = tmp_path / "cut"
    proc = cut_in_second_population(spec, cut)
    err = proc.stderr.read()
    assert proc.returncode == 143 and "run the same command to resume" in err, err
    finished = ledger(cut)
    assert len(finished) == 2 and {x["population"] for x in finished.values()} == {0}
    latest = sorted((cut / RUNS).glob(f"*/{LATEST}"))
    assert len(latest) == 2 and not {p.parents[1].name for p in latest} & set(finished)
    at = {ckpt.trainer_step(p) for p in latest}
    assert len(at) == 1 and CUT <= min(at) < STEPS, at  # both members stopped at one update, mid-run
    (at,) = at
    if mode == "branches":
        shutil.copytree(cut, tmp_path / "restart")

    r = runner.invoke(app, ["sweep", str(spec), "--out", str(cut)])
    assert r.exit_code == 0, r.output
    assert "resuming: 2 of 4 trial(s) already finished" in r.stderr
    assert f"resuming population 1 from update {at}" in r.stderr
    assert f"resumed from {latest[0]} at update {at} in its run directory" in (cut / "populations.log").read_text()
    assert rows_of(cut) == rows_of(tmp_path / "whole")
    assert report_of(cut) == report_of(tmp_path / "whole")
    assert not (cut / RUNS).exists()  # recorded trials keep no run directories

    if mode != "branches":
        return
    restart = tmp_path / "restart"
    next((restart / RUNS).glob(f"*/{LATEST}")).unlink()
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(restart)])
    assert r.exit_code == 0, r.output
    assert "restarting population 1 from update 0: member(s) " in r.stderr and "wrote no checkpoint" in r.stderr
    assert rows_of(restart) == rows_of(tmp_path / "whole")


def test_a_sweep_whose_spec_says_checkpoint_never_writes_none_and_restarts_a_cut_population(tmp_path):
    """``checkpoint = "never"`` (branches, an evaluation every 20 updates): a sweep SIGTERMed while its
    second population trains leaves its members' run directories without a latest.npz (past their
    evaluation at update 20), the interrupt message and the re-run say that population starts over and
    why, and the re-run ends with the rows of the same sweep never cut."""
    spec = write_spec(tmp_path, LOG + GRID, steps=STEPS, top='checkpoint = "never"\n')
    spec.write_text(spec.read_text().replace('"run.eval_every" = 0', '"run.eval_every" = 20'))
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "whole")])
    assert r.exit_code == 0, r.output
    assert "resume checkpoint is" not in r.stderr

    cut = tmp_path / "cut"
    proc = cut_in_second_population(spec, cut)
    err = proc.stderr.read()
    assert proc.returncode == 143 and "population cut mid-training starts over (the spec's checkpoint" in err, err
    left = [d for d in (cut / RUNS).iterdir() if d.name not in ledger(cut)]
    assert len(left) == 2 and all(_logged(d / "metrics.jsonl", CUT) for d in left)
    assert not list((cut / RUNS).rglob("*.npz"))  # no resume checkpoint, evaluations or SIGTERM notwithstanding

    r = runner.invoke(app, ["sweep", str(spec), "--out", str(cut)])
    assert r.exit_code == 0, r.output
    assert "resuming: 2 of 4 trial(s) already finished" in r.stderr
    assert (
        'restarting population 1 from update 0: its members write no checkpoints (the spec\'s checkpoint = "never")'
        in r.stderr
    )
    assert rows_of(cut) == rows_of(tmp_path / "whole") and report_of(cut) == report_of(tmp_path / "whole")
    assert not (cut / RUNS).exists()


def test_resume_plan_resumes_only_checkpoints_of_one_update_and_the_trials_configs(tmp_path):
    """resume_plan of a population whose two members stopped at update 20: it resumes from their
    checkpoints; it starts over (removing the run directories) and says why when a member's checkpoint
    is at another update, missing or of another config, or the executor keeps none (Ray); a population
    never started gets no line."""
    spec = load_spec(write_spec(tmp_path, LOG + GRID))
    sd = SweepDir(tmp_path / "sd", spec, echo=lambda m: None)
    try:
        trials = pack(make_trials(spec, spec.configurations(), False, None), lambda t: 2)[0]
        assert resume_plan(sd, 3, trials) == (None, None)
        pop = Population([t.config for t in trials], run_dirs=[sd.run_dir(t.key) for t in trials], echo=lambda m: None)

        def progress(i, step, row, ev):
            if i == 1 and step == 20:
                signal.raise_signal(signal.SIGTERM)

        with pytest.raises(Interrupted):
            pop.run(30, progress=progress)
        pristine = tmp_path / "pristine"
        shutil.copytree(sd.path / RUNS, pristine)

        def plan(ts=trials, **kw):
            shutil.rmtree(sd.path / RUNS, ignore_errors=True)
            shutil.copytree(pristine, sd.path / RUNS)
            return resume_plan(sd, 3, ts, **kw)

        paths, line = plan()
        assert paths == [sd.run_dir(t.key) / LATEST for t in trials]
        assert line.startswith("resuming population 3 from update 20 ")
        later = ckpt.load(pristine / trials[1].key / LATEST)
        later[1]["step"] = 21
        ckpt.save(pristine / trials[1].key / LATEST, later[0], later[1])
        paths, line = plan()
        assert paths is None and line.endswith("at different updates [20, 21]")
        assert not any(sd.run_dir(t.key).exists() for t in trials)  # started over in fresh directories
        other = replace(trials[1], config=replace(trials[1].config, optim=replace(trials[1].config.optim, lr=0.5)))
        line = plan([trials[0], other])[1]
        assert "member 1's checkpoint" in line and line.endswith("is of another config than its trial's (optim.lr)")
        assert (
            plan(checkpoints=False)[1]
            == "restarting population 3 from update 0: populations on Ray actors keep no checkpoints"
        )
        (pristine / trials[0].key / LATEST).unlink()
        assert plan() == (
            None,
            "restarting population 3 from update 0: member(s) 0 of 2 wrote no checkpoint before the sweep stopped",
        )

        def when(mode):  # the trials of a spec with checkpoint = mode
            return [
                replace(t, config=replace(t.config, run=replace(t.config.run, resume_checkpoint=mode))) for t in trials
            ]

        assert plan(when("never"))[1].endswith('its members write no checkpoints (the spec\'s checkpoint = "never")')
        (pristine / trials[1].key / LATEST).unlink()
        assert plan(when("end"))[1].endswith(
            'member(s) 0, 1 of 2 wrote no checkpoint before the sweep stopped (the spec\'s checkpoint = "end": '
            "only a Ctrl-C or SIGTERM of the sweep writes one mid-run)"
        )
    finally:
        sd.close()
