"""``cudarl-train sweep``: spec, populations, ledger and resume, the ranked report, Optuna rounds."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cudarl.cli import app
from cudarl.config import ConfigError, from_dict
from cudarl.sweep import SpecError, load_spec
from cudarl.sweep.core import make_trials, pack, population_capacity
from cudarl.testing import TINY_SWEEP_SET

runner = CliRunner()


def write_spec(
    tmp_path, body: str = "", *, seeds=2, population=2, steps=30, name="s", data="builtin:ar?n=1500", top=""
):
    """A tiny sweep spec (CPU, 30 updates a trial) with ``body`` appended (``top``: top-level lines); returns
    its path."""
    p = tmp_path / f"{name}.toml"
    head = f'name = "{name}"\ndata = "{data}"\nseeds = {seeds}\npopulation = {population}\n{top}'
    tiny = TINY_SWEEP_SET.format(device="cpu", steps=steps)
    p.write_text(head + f'out = "{tmp_path / "sweeps"}"\n\n[set]\n' + tiny + body)
    return p


GRID = '\n[grid]\n"optim.lr" = [1e-4, 1e-3]\n'


def ledger(d: Path) -> dict:
    return {p.stem: json.loads(p.read_text()) for p in (d / "trials").glob("*.json")}


def test_sweep_end_to_end_writes_ranked_table_csv_json_and_plot(tmp_path):
    spec = write_spec(tmp_path, GRID)
    r = runner.invoke(app, ["sweep", str(spec)])
    assert r.exit_code == 0, r.output
    d = tmp_path / "sweeps" / "s"
    assert {"sweep.csv", "sweep.json", "sweep.png", "spec.toml"} <= {p.name for p in d.iterdir()}
    rows = list(csv.DictReader((d / "sweep.csv").open()))
    assert len(rows) == 4 and len({x["key"] for x in rows}) == 4  # 2 configurations x 2 seeds, each once
    assert {(x["optim.lr"], x["seed"]) for x in rows} == {(lr, s) for lr in ("0.0001", "0.001") for s in ("0", "1")}
    for x in rows:
        assert (d / x["policy"]).is_file() and x["val_sharpe"] and x["test_sharpe"]
    rep = json.loads((d / "sweep.json").read_text(), parse_constant=lambda c: 1 / 0)  # strict JSON
    cfgs = rep["configurations"]
    assert [c["rank"] for c in cfgs] == [1, 2] and rep["trials"] == 4 and rep["trained_now"] == 4
    # ranked by the validation mean, whatever test says; the mean is that of the csv's trials
    means = [c["val"]["sharpe"]["mean"] for c in cfgs]
    assert means == sorted(means, reverse=True)
    for c in cfgs:
        vals = [float(x["val_sharpe"]) for x in rows if int(x["config_id"]) == c["config_id"]]
        assert c["val"]["sharpe"]["mean"] == pytest.approx(sum(vals) / 2, rel=1e-12)
        lo, hi = c["val"]["sharpe_bootstrap_interval"]
        assert min(vals) <= lo <= hi <= max(vals)
        assert 0 <= c["val"]["dsr_mean"] <= 1 and c["val"]["dsr_trials"] == 2
    # the printed table: its first configuration is the validation winner
    lines = [x for x in r.stderr.splitlines() if x.strip().startswith(("1 ", "2 "))]
    assert lines[0].split()[1] == f"c{cfgs[0]['config_id']}"
    assert "ranked by validation Sharpe" in r.stderr
    assert "population 0 done" in r.stderr and "population 1 done" in r.stderr  # per-population progress


def test_dsr_falls_as_the_number_of_configurations_grows():
    from cudarl.sweep.report import trial_dsr

    def rec(key, cid, sharpe):
        split = {"sharpe": sharpe, "bars": 500, "skew": 0.0, "kurtosis": 3.0}
        return {"key": key, "config_id": cid, "val": split, "periods_per_year": 252}

    one = trial_dsr([rec("a", 0, 1.5)])
    many = trial_dsr([rec("a", 0, 1.5)] + [rec(f"k{i}", i, 0.2 * i - 1) for i in range(1, 20)])
    assert 0 < many["a"] < one["a"] < 1


@pytest.mark.parametrize(
    "body,words",
    [
        ('\n[grid]\n"optim.lrr" = [1e-4]\n', ['grid."optim.lrr"', "no field 'lrr'"]),
        ('\n[grid]\n"optim.lr" = 1e-4\n', ['grid."optim.lr"', "non-empty list"]),
        ('\n[grid]\n"agent.gamma" = [0.9, 1.5]\n', ['grid."agent.gamma" = 1.5', "gamma"]),
        ('\n[grid]\n"run.seed" = [1, 2]\n', ['grid."run.seed"', "seeds"]),
        ('"run.resume_checkpoint" = "never"\n', ['set."run.resume_checkpoint"', "the top-level `checkpoint`"]),
        ('\n[random]\nn = 2\n"optim.lr" = { log_uniform = [0, 1e-3] }\n', ['random."optim.lr".log_uniform']),
        ('\n[random]\nn = 2\n"optim.lr" = { normal = [0, 1] }\n', ['random."optim.lr"', "uniform"]),
        ("\n[bogus]\nx = 1\n", ["unknown key(s) ['bogus']"]),
    ],
)
def test_spec_errors_name_the_file_and_key(tmp_path, body, words):
    spec = write_spec(tmp_path, body)
    with pytest.raises(SpecError) as e:
        load_spec(spec)
    assert str(spec) in str(e.value)
    for w in words:
        assert w in str(e.value)
    r = runner.invoke(app, ["sweep", str(spec)])
    assert r.exit_code == 2 and str(spec) in r.stderr and not (tmp_path / "sweeps").exists()  # nothing written


def test_spec_checkpoint_sets_every_trials_resume_checkpoint_and_a_bad_one_is_refused(tmp_path):
    """The spec's ``checkpoint`` (default ``eval``) is every trial's ``run.resume_checkpoint``; another
    value is refused naming the file and the key, as the config refuses another ``resume_checkpoint``."""

    def modes(spec) -> set:
        return {t.config.run.resume_checkpoint for t in make_trials(spec, spec.configurations(), False, None)}

    assert modes(load_spec(write_spec(tmp_path, GRID))) == {"eval"}
    never = load_spec(write_spec(tmp_path, GRID, top='checkpoint = "never"\n', name="n"))
    assert never.checkpoint == "never" and modes(never) == {"never"}
    bad = write_spec(tmp_path, top='checkpoint = "sometimes"\n', name="b")
    with pytest.raises(SpecError) as e:
        load_spec(bad)
    assert str(e.value) == f'{bad}: checkpoint: expected one of "eval", "end", "never", got \'sometimes\''
    r = runner.invoke(app, ["sweep", str(bad)])
    assert r.exit_code == 2 and "checkpoint: expected one of" in r.stderr and not (tmp_path / "sweeps").exists()
    with pytest.raises(ConfigError, match=r"run: resume_checkpoint must be eval, end or never, got 'sometimes'"):
        from_dict({"run": {"resume_checkpoint": "sometimes"}})


def test_random_draws_are_seeded_and_in_range(tmp_path):
    body = '\n[random]\nn = 5\nseed = 7\n"optim.lr" = { log_uniform = [1e-5, 1e-3] }\n'
    body += '"net.hidden" = { choice = [[8], [16, 16]] }\n'
    a = load_spec(write_spec(tmp_path, body)).configurations()
    b = load_spec(write_spec(tmp_path, body)).configurations()
    assert a == b and len(a) == 5 and len({c["optim.lr"] for c in a}) == 5
    assert all(1e-5 <= c["optim.lr"] <= 1e-3 and c["net.hidden"] in ([8], [16, 16]) for c in a)


def test_packing_respects_folds_sharing_and_capacity(tmp_path, monkeypatch):
    import cudarl.population
    from cudarl.sweep.core import make_trials

    spec = load_spec(write_spec(tmp_path, '\n[grid]\n"net.hidden" = [[8], [16]]\n', seeds=3, population=0))
    trials = make_trials(spec, spec.configurations(), False, None)
    groups = pack(trials, lambda t: population_capacity(t.config, False, 2, None))
    # two net shapes never share a population; at most 2 members each
    assert [len(g) for g in groups] == [2, 1, 2, 1]
    assert all(len({tuple(t.config.net.hidden) for t in g}) == 1 for g in groups)
    # on the GPU: as many as fit in the free memory's share (memory_per_member is measured: fixed here),
    # or the spec's cap
    cfg, m = trials[0].config, 1 << 20
    monkeypatch.setattr(cudarl.population, "memory_per_member", lambda c, bars=None, splits=None: m)
    assert population_capacity(cfg, True, 0, 10 * m) == 8
    assert population_capacity(cfg, True, 3, 10 * m) == 3
    assert population_capacity(cfg, False, 0, None) == 4


def test_folds_give_one_trial_a_fold_with_its_own_splits(tmp_path):
    spec = (
        write_spec(tmp_path, "", seeds=1, population=4, name="wf")
        .read_text()
        .replace("seeds = 1", "seeds = 1\nfolds = 2")
    )
    p = tmp_path / "wf2.toml"
    p.write_text(spec)
    r = runner.invoke(app, ["sweep", str(p), "--out", str(tmp_path / "wf")])
    assert r.exit_code == 0, r.output
    recs = sorted(ledger(tmp_path / "wf").values(), key=lambda x: x["fold"])
    assert [x["fold"] for x in recs] == [0, 1]
    assert recs[0]["splits"]["test"][1] == recs[1]["splits"]["test"][0]  # adjacent test windows


def test_an_existing_sweep_of_another_spec_is_refused(tmp_path):
    spec = write_spec(tmp_path, GRID, seeds=1)
    assert runner.invoke(app, ["sweep", str(spec)]).exit_code == 0
    spec.write_text(spec.read_text().replace("1e-3]", "3e-3]"))
    r = runner.invoke(app, ["sweep", str(spec)])
    assert r.exit_code == 1 and "another spec" in r.stderr


def _start_and_stop_after(spec, d: Path, finished: int, sig) -> subprocess.Popen:
    """Run the sweep in a subprocess; send ``sig`` once ``finished`` trials are in its ledger."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cudarl.cli", "sweep", str(spec)], env=env, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list((d / "trials").glob("*.json"))) < finished:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.02)
    proc.send_signal(sig)
    proc.wait()
    return proc


def test_an_interrupted_sweep_resumes_without_redoing_finished_trials(tmp_path):
    # 4 trials, one a population, long enough (200 updates each) to stop the sweep between two
    spec = write_spec(tmp_path, GRID, population=1, steps=200)
    d = tmp_path / "sweeps" / "s"
    _start_and_stop_after(spec, d, 1, signal.SIGKILL)  # killed: no chance to clean up
    first = ledger(d)
    assert 1 <= len(first) < 4, "the sweep was not killed between two trials"
    stamps = {p.name: p.stat().st_mtime_ns for p in (d / "trials").iterdir()}
    assert not (d / "sweep.csv").exists()
    # resumed, then stopped by SIGTERM: it says how to go on and exits 143
    proc = _start_and_stop_after(spec, d, len(first) + 1, signal.SIGTERM)
    err = proc.stderr.read()
    assert f"resuming: {len(first)} of 4 trial(s) already finished" in err
    if len(first) + 1 < 4:  # trials were left when the signal came
        assert proc.returncode == 143 and "run the same command to resume" in err
    second = ledger(d)
    assert len(second) > len(first)
    r = runner.invoke(app, ["sweep", str(spec)])
    assert r.exit_code == 0, r.output
    if len(second) < 4:
        assert f"resuming: {len(second)} of 4 trial(s) already finished" in r.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (d / "trials").iterdir() if p.name in stamps} == stamps  # untouched
    rep = json.loads((d / "sweep.json").read_text())
    assert rep["trained_now"] == 4 - len(second) and rep["skipped_finished"] == len(second)
    rows = list(csv.DictReader((d / "sweep.csv").open()))
    assert len(rows) == 4 and len({x["key"] for x in rows}) == 4


def test_a_second_sweep_in_the_same_directory_is_refused_while_one_runs(tmp_path):
    from cudarl.sweep.core import SweepDir, SweepError

    spec = load_spec(write_spec(tmp_path, GRID))
    first = SweepDir(tmp_path / "x", spec, echo=lambda m: None)
    try:
        with pytest.raises(SweepError, match="another sweep is running"):
            SweepDir(tmp_path / "x", spec, echo=lambda m: None)
    finally:
        first.close()
    SweepDir(tmp_path / "x", spec, echo=lambda m: None).close()  # free again once the first has closed


def test_optuna_rounds_are_seeded_and_resume(tmp_path):
    pytest.importorskip("optuna")
    body = '\n[random]\nn = 2\nseed = 5\n"optim.lr" = { log_uniform = [1e-5, 1e-2] }\n'
    spec = write_spec(tmp_path, body, seeds=1, population=2)
    r = runner.invoke(app, ["sweep", str(spec), "--optuna", "2", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert "optuna round 2/2" in r.stderr
    a = json.loads((tmp_path / "a" / "optuna.json").read_text())["rounds"]
    assert len(a) == 2 and all(len(x) == 2 for x in a)
    assert len(ledger(tmp_path / "a")) == 4
    # the same spec elsewhere asks the same configurations (seeded sampler, equal history)
    r = runner.invoke(app, ["sweep", str(spec), "--optuna", "2", "--out", str(tmp_path / "b")])
    assert json.loads((tmp_path / "b" / "optuna.json").read_text())["rounds"] == a
    # a third round on the first directory replays the two (nothing retrained) and adds one
    r = runner.invoke(app, ["sweep", str(spec), "--optuna", "3", "--out", str(tmp_path / "a")])
    assert r.exit_code == 0, r.output
    assert r.stderr.count("already finished") == 2
    assert len(ledger(tmp_path / "a")) == 6


def test_trial_config_is_resolved_for_the_backend_it_runs_on(tmp_path):
    spec = load_spec(write_spec(tmp_path, GRID))
    cfg, explicit = spec.trial_config({"optim.lr": 1e-3}, 3)
    assert cfg.run.seed == 3 and cfg.optim.lr == 1e-3 and cfg.run.name == "s"
    assert explicit["optim"]["lr"] == 1e-3
    assert from_dict(explicit).to_dict() == cfg.to_dict()


def test_ranking_reads_validation_only_never_test():
    from cudarl.sweep.report import summarise, table_lines

    def rec(key, cid, val, test):
        def split(s):
            return {"sharpe": s, "psr": 0.5, "trading": True, "bars": 300, "skew": 0.0, "kurtosis": 3.0}

        return {
            "key": key,
            "config_id": cid,
            "params": {"optim.lr": cid},
            "val": split(val),
            "test": split(test),
            "periods_per_year": 252,
        }

    records = [rec("a", 0, 0.1, 3.0), rec("b", 0, 0.2, 2.5), rec("c", 1, 1.0, -1.0), rec("d", 1, 1.2, -2.0)]
    rows = summarise(records, resamples=50)
    assert [r["config_id"] for r in rows] == [1, 0]  # the validation winner first, though its test is worse
    assert rows[0]["test"]["sharpe"]["mean"] == pytest.approx(-1.5)
    assert table_lines(rows)[1].split()[:2] == ["1", "c1"]


def test_packing_for_several_workers_leaves_none_alone(tmp_path):
    from cudarl.sweep.core import make_trials

    spec = load_spec(write_spec(tmp_path, '\n[grid]\n"optim.lr" = [1e-4, 2e-4, 3e-4, 4e-4]\n', seeds=3))
    trials = make_trials(spec, spec.configurations(), False, None)
    cap = lambda t: 4  # noqa: E731
    assert [len(g) for g in pack(trials, cap)] == [4, 4, 4]
    assert [len(g) for g in pack(trials, cap, slots=2)] == [3, 3, 3, 3]  # two rounds on two workers
    groups = pack(trials, cap, slots=5)
    assert len(groups) == 5 and sum(map(len, groups)) == 12 and max(map(len, groups)) <= 4
    assert [t.key for g in groups for t in g] == [t.key for t in trials]  # every trial once, in order


def test_a_trial_its_guard_stopped_is_recorded_as_such(tmp_path):
    # a "spike" of 1.0001 times the median of the last two losses trips soon: the guard stops the trial
    body = '"guard.action" = "stop"\n"guard.window" = 2\n"guard.spike_factor" = 1.0001\n'
    spec = write_spec(tmp_path, body, seeds=1)
    r = runner.invoke(app, ["sweep", str(spec)])
    assert r.exit_code == 0, r.output
    (rec,) = ledger(tmp_path / "sweeps" / "s").values()
    assert "spike" in rec["guard_stop"] and rec["step"] < 30
    (row,) = csv.DictReader((tmp_path / "sweeps" / "s" / "sweep.csv").open())
    assert row["guard_stop"] == rec["guard_stop"]


def test_a_joined_sweep_gives_each_trial_the_branches_sweeps_numbers(tmp_path):
    """``run.population = "joined"`` in a spec (the agent axis: one launch per operation for a population's
    members): trials are packed with the seeds of one configuration together (the only fields joined
    members may differ in) and each trial's validation and test numbers and weights are the branches
    sweep's, bit for bit."""
    rows = {}
    for mode in ("branches", "joined"):
        spec = write_spec(tmp_path, f'"run.population" = "{mode}"\n' + GRID, name=mode)
        r = runner.invoke(app, ["sweep", str(spec)])
        assert r.exit_code == 0, r.output
        got = list(csv.DictReader((tmp_path / "sweeps" / mode / "sweep.csv").open()))
        rows[mode] = {(x["optim.lr"], x["seed"]): x for x in got}
    assert rows["joined"].keys() == rows["branches"].keys() and len(rows["joined"]) == 4
    for k, x in rows["joined"].items():
        y = rows["branches"][k]
        assert (x["val_sharpe"], x["test_sharpe"]) == (y["val_sharpe"], y["test_sharpe"]), k
    digests = {}
    for mode in rows:  # the trials' keys hash their configs (run.population too): matched by (lr, seed)
        by_key = {t["key"]: t.get("weights_sha256") for t in ledger(tmp_path / "sweeps" / mode).values()}
        digests[mode] = {k: by_key[x["key"]] for k, x in rows[mode].items()}
    assert digests["joined"] == digests["branches"] and None not in digests["joined"].values()
