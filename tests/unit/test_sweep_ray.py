"""``cudarl-train sweep --ray``: populations on a local Ray instance (CPU actors, NumPy backend), an actor
killed mid-sweep, and the same numbers as a sweep in one process, bit for bit."""

import csv
import json
import time

import pytest
from test_sweep import GRID, ledger, write_spec
from typer.testing import CliRunner

from cudarl.cli import app
from cudarl.sweep import load_spec, run_sweep

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'cudarl[cluster]')")
runner = CliRunner()


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance with two CPUs for the module (started once: its start-up is printed)."""
    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    print(f"local Ray started in {time.perf_counter() - t0:.1f} s")
    yield
    ray.shutdown()


def test_ray_sweep_with_a_killed_actor_retries_its_trials_once_and_matches_one_process(tmp_path, local_ray):
    from cudarl.sweep.cluster import RayExecutor

    spec = write_spec(tmp_path, GRID)  # 4 trials in 2 populations of 2
    killed = []

    def kill_first(executor, actor, job):
        if not killed:  # the first population's actor dies with its population in hand
            killed.append(job)
            ray.kill(actor)

    t0 = time.perf_counter()
    ex = RayExecutor(workers=2, device="cpu", on_dispatch=kill_first, echo=lambda m: None)
    print(f"2 CPU actors ready in {time.perf_counter() - t0:.1f} s")
    rep = run_sweep(load_spec(spec), out=tmp_path / "ray", executor=ex, echo=lambda m: None)
    (job,) = killed
    assert [r["population"] for r in rep["retried"]] == [job["index"]]
    assert rep["retried"][0]["trials"] == [t["key"] for t in job["trials"]]
    assert "died" in rep["retried"][0]["reason"]
    rows = list(csv.DictReader((tmp_path / "ray" / "sweep.csv").open()))
    assert len(rows) == 4 and len({x["key"] for x in rows}) == 4  # every trial exactly once
    # the same trials in this process: the same numbers and weights, bit for bit
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "local")])
    assert r.exit_code == 0, r.output
    a, b = ledger(tmp_path / "local"), ledger(tmp_path / "ray")
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k]["val"] == b[k]["val"] and a[k]["test"] == b[k]["test"]
        assert a[k]["weights_sha256"] == b[k]["weights_sha256"]
        assert (tmp_path / "local" / a[k]["policy"]).read_bytes() == (tmp_path / "ray" / b[k]["policy"]).read_bytes()
    assert {x["backend"] for x in (v["worker"] for v in b.values())} == {"numpy"}


def test_cli_ray_flag_runs_the_sweep_on_the_cluster(tmp_path, local_ray):
    spec = write_spec(tmp_path, "", seeds=2, population=1)
    r = runner.invoke(app, ["sweep", str(spec), "--ray", "--workers", "2"])
    assert r.exit_code == 0, r.output
    assert "2 Ray CPU actor(s)" in r.stderr
    rep = json.loads((tmp_path / "sweeps" / "s" / "sweep.json").read_text())
    assert rep["trials"] == 2 and rep["retried"] == []
    pids = {v["worker"]["pid"] for v in ledger(tmp_path / "sweeps" / "s").values()}
    assert len(pids) == 2  # one population on each actor
