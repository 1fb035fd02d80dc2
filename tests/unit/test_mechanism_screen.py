"""tools/mechanism_screen.py end to end on the CPU at a tiny budget: the behaviour runs are recorded
first, the offline rows train from them, and the on/off table pairs each row with its reference."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))


def _tiny_regime(monkeypatch):
    """The learning check's ``regime`` task and its CPU budget cut to a few seconds a run."""
    import learning_check

    task = {**learning_check.TASKS["regime"], "config": {"data": {"source": "builtin:regime?n=1500"}}}
    monkeypatch.setitem(learning_check.TASKS, "regime", task)
    tiny = {"run": {"steps": 30, "eval_every": 0}, "env": {"n_envs": 8, "episode_len": 128}}
    tiny["agent"] = {"batch_size": 32, "learning_starts": 200}
    tiny["replay"] = {"capacity": 4096}
    monkeypatch.setattr(learning_check, "QUICK", tiny)


@pytest.mark.slow
def test_the_screen_records_then_trains_offline_and_tabulates(tmp_path, monkeypatch):
    import mechanism_screen

    _tiny_regime(monkeypatch)
    out, md, jsonl = tmp_path / "m.json", tmp_path / "m.md", tmp_path / "m.jsonl"
    argv = ["x", "--quick", "--seeds", "1", "--workers", "1", "--device", "cpu", "--only", "offline"]
    argv += ["--out", str(out), "--md", str(md), "--jsonl", str(jsonl), "--recordings", str(tmp_path / "rec")]
    monkeypatch.setattr(sys, "argv", argv)
    assert mechanism_screen.main() == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["variant"] for r in rows][0] == "behaviour (recorded)"
    assert (tmp_path / "rec" / "behaviour-0.safetensors").is_file()
    table = {(e["row"], e["head"]): e for e in json.loads(out.read_text())["table"]}
    assert table[("offline cql 1", "iqn")]["compared_with"] == "offline ddqn"
    assert "difference" in table[("offline cql 1", "c51")] and table[("offline ddqn", "c51")]["n"] == 1
    assert "| offline (CQL) | offline cql 1 |" in md.read_text()


@pytest.mark.slow
def test_the_risk_screen_runs_and_pairs_each_measure_with_the_mean(tmp_path, monkeypatch):
    """tools/risk_screen.py on the CPU at a tiny budget: each variant's Sharpe and drawdown, gated and
    with the gate off, and the paired difference from acting on the mean."""
    import risk_screen

    _tiny_regime(monkeypatch)
    out, md, jsonl = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "r.jsonl"
    argv = ["x", "--quick", "--seeds", "1", "--device", "cpu", "--tasks", "regime", "--heads", "c51"]
    argv += ["--only", "cvar 0.1", "--out", str(out), "--md", str(md), "--jsonl", str(jsonl)]
    monkeypatch.setattr(sys, "argv", argv)
    assert risk_screen.main() == 0
    got = json.loads(out.read_text())
    assert sorted(r["sets"][0] for r in got["rows"]) == ["agent.act_by=cvar", "agent.act_by=mean"]
    table = {e["variant"]: e for e in got["table"]}
    assert set(table) == {"mean", "cvar 0.1"} and table["cvar 0.1"]["n"] == 1
    assert "ungated_max_drawdown_difference" in table["cvar 0.1"] and "sharpe_difference" not in table["mean"]
    assert all(r["views"]["margin=0"]["max_drawdown"] is not None for r in got["rows"])
    assert "| regime | c51 | cvar 0.1 |" in md.read_text()
    # a second call with --resume runs only what the first did not, and tabulates both calls' rows
    monkeypatch.setattr(sys, "argv", [*argv[:-6], "--only", "cvar 0.1,cvar 0.5", *argv[-6:], "--resume"])
    assert risk_screen.main() == 0
    rows = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert [r["variant"] for r in rows][2:] == ["cvar 0.5"]
    assert {e["variant"] for e in json.loads(out.read_text())["table"]} == {"mean", "cvar 0.1", "cvar 0.5"}


def test_a_runs_row_carries_causals_sensitivities_and_selectivitys_gates(monkeypatch):
    """Issue 19 (items 4 and 6): a screen row of a run with ``causal`` or ``selectivity`` carries what its test
    evaluation's summary reports, each group's measured sensitivity and the features the agent uses."""
    import learning_check

    _tiny_regime(monkeypatch)
    row = learning_check.run_one("regime", "c51", 0, "cpu", True, {"agent": {"aux": ["causal", "selectivity"]}})
    assert list(row["causal_sensitivity"]) == ["calendar"] and row["causal_sensitivity"]["calendar"] > 0
    assert len(row["features_used"]) > 1 and all(0 < gate < 1 for _, gate in row["features_used"])
    json.dumps(row)
    plain = learning_check.run_one("regime", "c51", 0, "cpu", True, {})
    assert "causal_sensitivity" not in plain and "features_used" not in plain


def test_the_workers_go_to_the_runs_there_are():
    """Online rows alone get every worker (at 3795f4e they got one of nine, and the aux screen ran one
    run at a time); with the offline chain beside them, it gets a quarter."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from mechanism_screen import split_workers

    assert split_workers(9, online=True, offline=False) == (9, 0)
    assert split_workers(9, online=False, offline=True) == (0, 9)
    assert split_workers(14, online=True, offline=True) == (11, 3)
    assert split_workers(2, online=True, offline=True) == (1, 1)
