"""tools/run_plan.py and the screens' plumbing around it: which runs a resumed call skips, the order
runs start in, the deadline that declines a run expected to end after it, and the tables rebuilt from a
JSON-lines file (``--table-only``) with the gate-off columns."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import run_plan  # noqa: E402


def _job(task="regime", head="c51", seed=0, variant="base", **kw):
    return {"task": task, "head": head, "seed": seed, "variant": variant, "sets": [], **kw}


def test_pending_skips_finished_runs_and_repeats_failed_ones():
    jobs = [_job(seed=s, variant=v) for v in ("base", "aux risk") for s in (0, 1)]
    rows = [
        {**_job(seed=0), "error": None},
        {**_job(seed=1, variant="aux risk"), "error": "CUDARuntimeError: boom"},
    ]
    left = run_plan.pending(jobs, rows)
    assert [(j["variant"], j["seed"]) for j in left] == [("base", 1), ("aux risk", 0), ("aux risk", 1)]


def test_seed_major_orders_seeds_then_longest_first_keeping_the_reference_first():
    walls = {("regime", "iqn"): 90.0, ("regime", "c51"): 40.0, ("sp500", "c51"): 20.0}
    jobs = [
        _job(task=t, head=h, seed=s, variant=v)
        for v in ("base", "aux risk")
        for t, h in (("sp500", "c51"), ("regime", "c51"), ("regime", "iqn"), ("canary", "c51"))
        for s in (0, 1)
    ]
    got = [(j["seed"], j["task"], j["head"], j["variant"]) for j in run_plan.seed_major(jobs, walls)]
    assert got[:4] == [(0, "regime", "iqn", "base"), (0, "regime", "iqn", "aux risk")] + [
        (0, "regime", "c51", "base"),
        (0, "regime", "c51", "aux risk"),
    ]
    assert got[6:8] == [(0, "canary", "c51", "base"), (0, "canary", "c51", "aux risk")]  # no record: last
    assert [g[0] for g in got] == [0] * 8 + [1] * 8


def test_start_by_declines_a_run_expected_to_end_after_the_deadline():
    assert run_plan.StartBy(None)(_job()) and run_plan.StartBy(100.0)(_job())  # nothing known: it starts
    gate = run_plan.StartBy(100.0, {("regime", "iqn"): 150.0, ("regime", "c51"): 50.0})
    assert gate(_job(head="c51")) and not gate(_job(head="iqn"))
    gate.saw({**_job(head="iqn"), "wall_s": 60.0})  # this call's runs replace the record
    assert gate(_job(head="iqn"))
    assert not gate(_job(task="ou", head="iqn"))  # unknown: twice the longest known (120 s)
    assert [j["task"] for j in gate.declined] == ["regime", "ou"]


def test_recorded_walls_are_medians_over_json_and_jsonl_calls(tmp_path):
    rows = [{**_job(), "wall_s": w, "error": None} for w in (10.0, 30.0)]
    (tmp_path / "call-a-learning_check.json").write_text(json.dumps({"rows": rows}))
    bad = {**_job(), "wall_s": 1000.0, "error": "x"}  # a failed run says nothing of a run's length
    lines = [{**_job(), "wall_s": 20.0, "error": None}, bad, {**_job(head="iqn"), "wall_s": 70.0}]
    (tmp_path / "call-b-learning_check.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert run_plan.recorded_walls(tmp_path) == {("regime", "c51"): 20.0, ("regime", "iqn"): 70.0}
    assert run_plan.recorded_walls()  # the repository's recorded calls are found


def test_run_jobs_starts_only_what_start_if_accepts(monkeypatch):
    import learning_check

    monkeypatch.setattr(learning_check, "_run_job", lambda job: {**job, "error": None, "wall_s": 1.0})
    seen = []
    jobs = [_job(seed=s) for s in range(4)]
    rows = learning_check.run_jobs(jobs, 1, seen.append, start_if=lambda j: j["seed"] != 2)
    assert [r["seed"] for r in rows] == [0, 1, 3] and rows == seen


def test_run_jobs_in_processes_keeps_job_order_and_declines():
    """The process pool: a declined job has no row; rows come back in job order (unknown tasks fail at
    once in the worker, which is all this needs)."""
    import learning_check

    jobs = [{**_job(task=f"no-such-task-{i}"), "device": "cpu", "quick": True} for i in range(4)]
    seen = []
    rows = learning_check.run_jobs(jobs, 2, seen.append, start_if=lambda j: not j["task"].endswith("1"))
    assert [r["task"] for r in rows] == ["no-such-task-0", "no-such-task-2", "no-such-task-3"]
    assert all(r["error"].startswith("KeyError") for r in rows) and len(seen) == 3


def test_only_aux_selects_all_seven_signals_on_the_real_series_and_narrows():
    import mechanism_screen

    rows = mechanism_screen.select("aux", "", "")
    sets = {s for r in rows for s in r[4]}
    for name in ("horizons", "risk", "denoise", "horizons,vaccine", "homeostatic", "causal", "selectivity"):
        assert f"agent.aux=[{name}]" in sets
        assert any(r[2] == "sp500" and f"agent.aux=[{name}]" in r[4] for r in rows), name
    core = mechanism_screen.select("aux", "regime,sp500", "c51")
    assert {(r[2], h) for r in core for h in r[3]} == {("regime", "c51"), ("sp500", "c51")}
    assert [r[0] for r in core if r[0] == "base"] == ["base", "base"] and len(core) == 17


def _row(variant, seed, sharpe, ungated, task="regime", head="c51", **kw):
    views = {"margin=0": {"sharpe": ungated, "max_drawdown": -0.1 * (seed + 1)}}
    return {"task": task, "head": head, "seed": seed, "variant": variant, "sets": [], "error": None,
            "test_sharpe": sharpe, "test_trades": 0 if sharpe is None else 5, "test_max_drawdown": -0.2,
            "views": views, **kw}  # fmt: skip


def test_table_only_rebuilds_both_tables_with_the_gate_off_columns(tmp_path, monkeypatch):
    import mechanism_screen
    import risk_screen

    aux = [_row("base", s, None, 0.1 * s, mechanism="defaults") for s in (0, 1)]
    aux += [_row("aux risk", s, 0.5, 0.2 + 0.1 * s, mechanism="aux: risk head") for s in (0, 1)]
    risk = [_row("mean", s, None, 0.1 * s) for s in (0, 1)] + [_row("cvar 0.1", s, 0.3, 0.4) for s in (0, 1)]
    for tool, rows, name in ((mechanism_screen, aux, "aux"), (risk_screen, risk, "risk")):
        jsonl = tmp_path / f"{name}.jsonl"
        jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
        argv = ["x", "--table-only", "--jsonl", str(jsonl), "--out", str(tmp_path / f"{name}.json")]
        monkeypatch.setattr(sys, "argv", [*argv, "--md", str(tmp_path / f"{name}.md")])
        assert tool.main() == 0
    md = (tmp_path / "aux.md").read_text()
    # deployed: flat base counts 0, so +0.50; gate off: 0.2-0.0 and 0.3-0.1, +0.20
    assert "| base | 0.00 ± 0.00 (n=2) | 0.50 ± 0.00 (n=2) | 0.25 ± 0.07 (n=2) | 0.20 ± 0.00 (n=2) |" in md
    assert "Sharpe, gate off | difference, gate off |" in md
    entry = {e["variant"]: e for e in json.loads((tmp_path / "risk.json").read_text())["table"]}["cvar 0.1"]
    assert entry["ungated_sharpe_difference"] == pytest.approx([0.35, 0.1 / 2**0.5, 2])
    assert "| regime | c51 | cvar 0.1 |" in (tmp_path / "risk.md").read_text()


def test_sweep_resume_runs_only_the_seeds_and_runs_an_earlier_call_left(tmp_path, monkeypatch, capsys):
    """tools/sweep.py over two calls (tools/gpu_encoders.sh): ``--seed-list`` picks a call's seeds,
    ``--resume`` skips the runs whose row ``--jsonl`` holds, and the table covers every call's rows."""
    import learning_check
    import sweep

    ran = []

    def fake_run_jobs(jobs, workers, on_row, start_if=None, run_root=None, resume=False):
        rows = []
        for j in jobs:
            ran.append((j["variant"], j["seed"]))
            rows.append({**j, "error": None, "test_sharpe": 1.0, "wall_s": 1.0})
            on_row(rows[-1])
        return rows

    monkeypatch.setattr(learning_check, "run_jobs", fake_run_jobs)
    monkeypatch.setattr(learning_check, "describe", lambda r: "ok")
    monkeypatch.setattr(sweep, "summarise", lambda rows: sorted((r["variant"], r["seed"]) for r in rows))
    monkeypatch.setattr(sweep, "markdown", lambda summary, header: repr(summary))
    jsonl, md = tmp_path / "rows.jsonl", tmp_path / "table.md"
    common = ["--tasks", "lag", "--device", "cpu", "--jsonl", str(jsonl), "--md", str(md), "--resume"]
    common += ["--variant", "ssm:net.encoder=ssm", "--variant", "attention:net.encoder=attention"]
    for seed_list in ("0", "0,1"):
        monkeypatch.setattr(sys, "argv", ["sweep.py", *common, "--seed-list", seed_list])
        assert sweep.main() == 0
    assert ran == [("ssm", 0), ("attention", 0), ("ssm", 1), ("attention", 1)]  # seed 0 not run twice
    assert md.read_text() == repr([("attention", 0), ("attention", 1), ("ssm", 0), ("ssm", 1)])


def test_pool_workers_share_the_cpus_out_for_their_blas_threads(monkeypatch):
    """learning_check's pool (tools/sweep.py --workers N): each spawned worker's BLAS gets cpus // N
    threads unless the caller chose; the parent's environment is left as it was."""
    import multiprocessing as mp
    import os

    import learning_check

    for v in learning_check.BLAS_THREAD_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "7")
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    with learning_check._blas_threads(3), mp.get_context("spawn").Pool(1) as pool:
        seen = {v: pool.apply(os.getenv, (v,)) for v in learning_check.BLAS_THREAD_VARS}
    assert seen == {"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "7"}
    assert "OPENBLAS_NUM_THREADS" not in os.environ and os.environ["MKL_NUM_THREADS"] == "7"
    with learning_check._blas_threads(16):  # more workers than CPUs: one thread each
        assert os.environ["OMP_NUM_THREADS"] == "1"
