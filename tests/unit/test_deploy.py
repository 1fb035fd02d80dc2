"""The deployment rules of ``[eval]`` through the trainer: each one, switched on, moves what it should."""

import json
from dataclasses import replace

import numpy as np
import pytest

from cudarl.checkpoint import CheckpointError
from cudarl.config import EvalConfig, from_dict, resolve_for_backend
from cudarl.trainer import Trainer


def trainer(source, steps, **sections):
    over = {
        "run": {"device": "cpu", "steps": max(steps, 1), "eval_every": 0, "checkpoint_every": 0},
        "data": {"source": source},
        "env": {"n_envs": 8, "episode_len": 128},
        **sections,
    }
    cfg = resolve_for_backend(from_dict(over), False, over)
    tr = Trainer(cfg, run_dir=False, echo=lambda m: None)
    if steps:
        tr.run()
    return tr


@pytest.fixture(scope="module")
def canary():
    """Trained on the leak for a few hundred updates: a policy with a real, large validation edge."""
    return trainer(
        "builtin:canary?n=2000",
        300,
        features={"extra": ["next_return"]},
        agent={"gamma": 0.5},
        replay={"n_step": 1},
    )


def with_eval(tr, **kw):
    tr.cfg = replace(tr.cfg, eval=EvalConfig(**kw))
    tr._val_psr = None
    return tr


def test_the_gate_opens_on_a_validated_edge_and_closes_on_none(canary):
    tr = with_eval(canary, gate_psr=0.95)
    test = tr.evaluate("test", write=False)
    assert test["deployment"]["gate"] == "open" and test["deployment"]["validation_psr"] > 0.95
    assert test["policy"]["trades"] > 10
    # an untrained agent on a martingale has no validated edge: the deployed policy is flat
    tr = with_eval(trainer("builtin:noise?n=1500", 0), gate_psr=0.0)
    psr = tr.validation_psr()
    ungated = tr.evaluate("test", write=False)
    assert ungated["deployment"]["gate"] == "off"
    tr = with_eval(tr, gate_psr=min(0.99, psr + 0.01) if psr == psr else 0.5)
    gated = tr.evaluate("test", write=False)
    assert gated["deployment"]["gate"] == "closed" and not gated["deployment"]["trading"]
    assert gated["policy"]["trades"] == 0 and gated["policy"]["exposure"] == 0.0
    assert ungated["policy"]["exposure"] > 0  # the gate is what made it flat
    # the validation split itself is never gated: it is the evidence
    assert tr.evaluate("val", write=False)["deployment"]["trading"]


def test_the_margin_trades_less_and_a_huge_one_never_leaves_flat(canary):
    trades = []
    for m in (0.0, 0.05, 1e6):
        tr = with_eval(canary, margin=m)
        s = tr.evaluate("test", write=False)
        assert s["deployment"]["margin"] == m
        trades.append(s["policy"]["trades"])
    assert trades[0] > 10 and trades[1] <= trades[0] and trades[2] == 0, trades
    np.testing.assert_array_equal(canary.greedy_positions(canary.data.splits.test, margin=1e6), 0.0)


def test_evaluation_rows_are_strict_json_and_kept_in_order(tmp_path):
    over = {
        "run": {"device": "cpu", "steps": 40, "eval_every": 20, "checkpoint_every": 0, "log_every": 10},
        "data": {"source": "builtin:noise?n=900"},
        "env": {"n_envs": 4, "episode_len": 64},
        "agent": {"learning_starts": 64, "batch_size": 32},
    }
    cfg = resolve_for_backend(from_dict(over), False, over)
    tr = Trainer(cfg, run_dir=tmp_path / "run", echo=lambda m: None)
    tr.run()
    assert [r["step"] for r in tr.history] == [20, 40]
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    summary = json.loads((tmp_path / "run" / "eval" / "val-00000040" / "summary.json").read_text())
    assert {"statistics", "deployment"} <= set(summary) and "psr" in summary["statistics"]


def test_the_turnover_penalty_is_charged_in_training_only():
    """``agent.train_cost_bps`` raises the training environments' cost per unit of position change; the
    evaluation environments keep the true costs."""
    plain, pen = trainer("builtin:noise?n=900", 0), trainer("builtin:noise?n=900", 0, agent={"train_cost_bps": 50.0})
    assert pen.env.params.slippage_bps == 50.0 and plain.env.params.slippage_bps == 0.0
    assert pen._eval_env(pen.data.splits.test).params.slippage_bps == 0.0
    rewards = []
    for tr in (plain, pen):
        tr.env.reset()
        tr.env.step(actions=np.full(tr.env.n_envs, 2, np.int32))  # flat -> long: one unit of change
        rewards.append(np.asarray(tr.env.reward, dtype=np.float64))
    np.testing.assert_allclose(rewards[0] - rewards[1], 50e-4, rtol=1e-4)


#: a short CPU run that keeps the moving average of its weights (eval.average_halflife)
AVERAGED = {
    "run": {"device": "cpu", "steps": 60, "eval_every": 0, "checkpoint_every": 0},
    "data": {"source": "builtin:ar?n=900"},
    "env": {"n_envs": 4, "episode_len": 64},
    "agent": {"learning_starts": 64, "batch_size": 32},
    "eval": {"average_halflife": 20},
}


def test_the_moving_average_of_the_weights_is_what_evaluation_deploys(tmp_path):
    """``eval.average_halflife``: the trainer keeps an exponential moving average of the online weights
    (every 10 updates), evaluation acts with it, the online weights come back bit for bit, and a
    checkpoint carries it."""
    over = AVERAGED
    cfg = resolve_for_backend(from_dict(over), False, over)
    tr = Trainer(cfg, run_dir=tmp_path / "run", echo=lambda m: None)
    init = np.array(tr.agent.online.params)
    tr.run()
    plain = Trainer(replace(cfg, eval=EvalConfig()), run_dir=False, echo=lambda m: None)
    plain.run()
    assert tr.losses == plain.losses  # the average never touches training
    own, avg = np.array(tr.agent.online.params), np.array(tr.average)
    assert not np.array_equal(avg, own) and not np.array_equal(avg, init)
    # after 60 updates (6 averaging steps of rate 1 - 2^(-1/2)) the average is between start and end
    assert np.abs(avg - own).mean() < np.abs(init - own).mean()
    split = tr.data.splits.val
    averaged = tr.greedy_positions(split)
    assert np.array_equal(np.array(tr.agent.online.params), own)  # restored
    with tr._weights(True):
        q_avg = tr.greedy_positions(split, averaged=False)  # the network holding the average, not swapped again
    np.testing.assert_array_equal(averaged, q_avg)
    obs = np.asarray(tr.env.obs[:1])
    q_last, q_mean = np.zeros((1, 3), np.float32), np.zeros((1, 3), np.float32)
    tr.agent.q_values(obs, q_last)
    with tr._weights(True):
        tr.agent.q_values(obs, q_mean)
    assert not np.array_equal(q_last, q_mean)  # the averaged network is another function
    assert tr.evaluate("val", write=False)["deployment"]["weights"] == "moving average"
    tr.save()
    back = Trainer.resume(tmp_path / "run" / "checkpoints" / "latest.npz", echo=lambda m: None)
    np.testing.assert_array_equal(np.array(back.average), avg)


def test_a_checkpoint_evaluates_its_last_weights_or_their_moving_average(tmp_path):
    """``load_policy(latest.npz, weights=...)`` and ``cudarl-train evaluate --weights``: one run's checkpoint
    holds the last weights and their moving average, so both are evaluated on the same training; the default
    is what the run deploys (the average), a policy file holds one kind and refuses the other, and a run
    without an average refuses ``average``."""
    from typer.testing import CliRunner

    import cudarl
    from cudarl.cli import app
    from cudarl.policy import _split_params, load_policy, save_policy

    over = AVERAGED
    tr = Trainer(resolve_for_backend(from_dict(over), False, over), run_dir=tmp_path / "run", echo=lambda m: None)
    tr.run()
    latest = tr.save()
    layout = tr.agent.state_dict()["online"]["layout"]
    own = _split_params({"params": np.array(tr.agent.online.params), "layout": layout})
    avg = _split_params({"params": np.array(tr.average), "layout": layout})
    assert any(not np.array_equal(own[k], avg[k]) for k in own)
    for weights, want, kind in (
        ("deployed", avg, "moving average"),
        ("average", avg, "moving average"),
        ("last", own, "last"),
    ):
        pol = load_policy(latest, device="cpu", weights=weights)
        assert pol.state.weights_kind == kind and list(pol.state.weights) == list(want)
        for k, v in want.items():
            np.testing.assert_array_equal(pol.state.weights[k], v)
    assert cudarl.load_policy(latest, device="cpu", weights="last").state.weights_kind == "last"  # the public name
    file = save_policy(tmp_path / "avg.safetensors", tr)
    assert load_policy(file, device="cpu", weights="average").state.weights_kind == "moving average"
    with pytest.raises(CheckpointError, match="one set of weights .*moving average.*latest.npz holds both"):
        load_policy(file, device="cpu", weights="last")
    with pytest.raises(ValueError, match="weights takes deployed, last, average"):
        load_policy(latest, device="cpu", weights="best")
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "evaluate",
            str(latest),
            "--weights",
            "last",
            "--split",
            "val",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "ev_last"),
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads((tmp_path / "ev_last" / "summary.json").read_text())
    assert summary["deployment"]["weights"] == "last"
    r = runner.invoke(app, ["evaluate", str(latest), "--weights", "newest", "--device", "cpu"])
    assert r.exit_code == 2 and "--weights takes deployed, last, average" in r.output
    plain = Trainer(replace(tr.cfg, eval=EvalConfig()), run_dir=tmp_path / "plain", echo=lambda m: None)
    plain.run()
    with pytest.raises(CheckpointError, match="kept no moving average"):
        load_policy(plain.save(), device="cpu", weights="average")
    assert load_policy(plain.save(), device="cpu", weights="last").state.weights_kind == "last"


@pytest.mark.gpu
def test_gpu_deployment_rules_and_the_moving_average_match_their_cpu_meaning():
    """On the GPU: the moving average is kept on the training stream and swapped in and out there (the
    online weights come back bit for bit, and a run with it loses the same losses as one without: it
    never touches training), the margin keeps a huge one flat, the gate opens on the canary's edge."""
    over = {
        "run": {"device": "gpu", "steps": 400, "eval_every": 200, "checkpoint_every": 0},
        "data": {"source": "builtin:canary?n=2000"},
        "features": {"extra": ["next_return"]},
        "env": {"n_envs": 64, "episode_len": 128},
        "agent": {"gamma": 0.5, "learning_starts": 512, "batch_size": 64},
        "replay": {"n_step": 1, "capacity": 100_000},
    }
    plain = Trainer(from_dict(over), run_dir=False, echo=lambda m: None)
    plain.run()
    tr = Trainer(from_dict({**over, "eval": {"average_halflife": 50}}), run_dir=False, echo=lambda m: None)
    tr.run()
    assert tr.losses == plain.losses  # averaging and evaluating with it never touch training
    own = tr.agent.online.params.get()
    test = tr.evaluate("test", write=False)
    assert np.array_equal(tr.agent.online.params.get(), own)
    assert test["deployment"]["weights"] == "moving average" and test["deployment"]["gate"] == "open"
    assert test["policy"]["sharpe"] > 2
    assert not np.array_equal(tr.average.get(), own)
    np.testing.assert_array_equal(tr.greedy_positions(tr.data.splits.test, margin=1e6), 0.0)
