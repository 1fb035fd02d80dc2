"""``cudarl-train train --walk-forward K``: K folds trained and tested, each reported, then the aggregate."""

import json

import numpy as np
from typer.testing import CliRunner

from cudarl.cli import app
from cudarl.splits import walk_forward

runner = CliRunner()


def test_walk_forward_trains_each_fold_and_aggregates_their_test_bars(tmp_path):
    args = ["train", "builtin:ar?n=1500", "--walk-forward", "3", "--device", "cpu", "--steps", "30"]
    sets = ["env.n_envs=4", "env.episode_len=64", "agent.learning_starts=64", "agent.batch_size=32"]
    sets += ["run.eval_every=0", "run.checkpoint_every=0", "eval.resamples=50", "eval.gate_psr=0"]
    r = runner.invoke(app, args + ["--out", str(tmp_path)] + [x for s in sets for x in ("--set", s)])
    assert r.exit_code == 0, r.output
    (root,) = tmp_path.iterdir()
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        "fold-0",
        "fold-1",
        "fold-2",
        "walk_forward.json",
    ]
    rep = json.loads((root / "walk_forward.json").read_text(), parse_constant=lambda c: 1 / 0)  # strict JSON
    folds = rep["folds"]
    want = walk_forward(1500, folds=3, warmup=64)
    assert [f["splits"] for f in folds] == [w.as_dict() for w in want]
    for a, b in zip(folds, folds[1:], strict=False):  # test windows adjacent, in order
        assert a["splits"]["test"][1] == b["splits"]["test"][0]
    # every fold is a run of its own: its evaluation of the test window is on disk
    for i in range(len(folds)):
        assert (root / f"fold-{i}" / "eval" / "test-00000030" / "summary.json").is_file()
        assert (root / f"fold-{i}" / "checkpoints" / "latest.npz").is_file()
        assert (root / f"fold-{i}" / "checkpoints" / "best.safetensors").is_file()
    agg = rep["aggregate"]
    assert agg["bars"] == sum(f["splits"]["test"][1] - f["splits"]["test"][0] - 2 for f in folds)
    assert agg["fold_sharpe"]["n"] + agg["fold_sharpe"]["undefined"] == 3
    assert {"policy", "buy_and_hold", "statistics"} <= set(agg)
    assert "all folds" in r.stderr and "fold Sharpe" in r.stderr
    # the aggregate Sharpe is that of the folds' test returns joined
    nets = []
    for i in range(3):
        rows = (root / f"fold-{i}" / "eval" / "test-00000030" / "equity.csv").read_text().splitlines()[1:]
        nets += [float(line.split(",")[5]) for line in rows]
    nets = np.array(nets)
    assert nets.size == agg["bars"] and nets.std() > 0
    assert abs(agg["policy"]["sharpe"] - nets.mean() / nets.std(ddof=1) * np.sqrt(252)) < 1e-9


def test_walk_forward_refuses_resume(tmp_path):
    r = runner.invoke(app, ["train", "--walk-forward", "2", "--resume", str(tmp_path / "x.npz")])
    assert r.exit_code == 2 and "--walk-forward" in r.stderr
