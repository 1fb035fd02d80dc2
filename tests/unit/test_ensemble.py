"""``cudarl-train ensemble``: policies evaluated as one (mean of their Q, or a vote), beside each member."""

import json

import numpy as np
import pytest
from test_sweep import GRID, ledger, write_spec
from typer.testing import CliRunner

from cudarl.checkpoint import CheckpointError
from cudarl.cli import app
from cudarl.sweep.ensemble import _combine, evaluate_ensemble, sweep_members

runner = CliRunner()


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A finished tiny sweep: 2 configurations x 2 seeds."""
    tmp = tmp_path_factory.mktemp("ens")
    r = runner.invoke(app, ["sweep", str(write_spec(tmp, GRID))])
    assert r.exit_code == 0, r.output
    return tmp / "sweeps" / "s"


def test_an_ensemble_of_one_is_that_member_bit_for_bit(swept):
    for rec in ledger(swept).values():
        for mode in ("mean", "vote"):
            rep = evaluate_ensemble([swept / rec["policy"]], mode, device="cpu")
            assert rep["val"]["ensemble"] == rec["val"] and rep["test"]["ensemble"] == rec["test"]
            assert rep["val"]["members"] == [rec["val"]]
        # the same member twice: the mean and the vote are that member too
        rep = evaluate_ensemble([swept / rec["policy"]] * 2, "vote", device="cpu")
        assert rep["test"]["ensemble"] == rec["test"]


def test_ensemble_of_the_top_configuration_reports_against_its_members(swept, tmp_path):
    paths, splits, row = sweep_members(swept, rank=1)
    assert row["rank"] == 1 and len(paths) == 2 and splits is None
    out = tmp_path / "ens.json"
    r = runner.invoke(app, ["ensemble", "--sweep", str(swept), "--mode", "mean", "--out", str(out), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    rep = json.loads(out.read_text())
    recs = {str(swept / v["policy"]): v for v in ledger(swept).values()}
    for split in ("val", "test"):
        s = rep[split]
        member = [recs[p][split]["sharpe"] for p in rep["members"]]
        assert [m["sharpe"] for m in s["members"]] == member  # each member as the sweep measured it
        assert s["best_member_sharpe"] == max(member)
        e = s["ensemble"]["sharpe"] or 0.0
        assert s["beats_every_member"] == (e > max(member)) and s["beats_member_mean"] == (e > np.mean(member))
    assert "ensemble of 2 (mean)" in r.stdout
    # the vote differs from the mean on these members (a mechanism that acts)
    vote = evaluate_ensemble(paths, "vote", device="cpu")
    assert vote["val"]["ensemble"]["sharpe"] != rep["val"]["ensemble"]["sharpe"]


def test_combine_mean_and_vote_by_hand():
    qs = np.array(
        [
            [[0.0, 1.0, 0.5], [3.0, 0.0, 0.0]],
            [[0.0, 0.2, 0.9], [0.0, 1.0, 0.0]],
            [[0.1, 0.0, 0.8], [0.0, 0.0, 1.0]],
        ]
    )
    mean = _combine(qs, "mean", np)
    np.testing.assert_allclose(mean, qs.mean(0).astype(np.float32))
    vote = _combine(qs, "vote", np)
    # bar 0: votes 1, 1 (actions 1, 2) -> 2 wins 2 votes to 1; bar 1: one vote each -> the largest mean Q (action 0)
    np.testing.assert_array_equal(vote, [[0, 0, 1], [1, 0, 0]])


def test_members_that_read_different_observations_are_refused(swept, tmp_path):
    r = runner.invoke(app, ["sweep", str(write_spec(tmp_path, "", seeds=1, data="builtin:ou?n=1500"))])
    assert r.exit_code == 0, r.output
    (other,) = ledger(tmp_path / "sweeps" / "s").values()
    mine = next(iter(ledger(swept).values()))
    with pytest.raises(CheckpointError, match="must read the same observations"):
        evaluate_ensemble([swept / mine["policy"], tmp_path / "sweeps" / "s" / other["policy"]], device="cpu")
