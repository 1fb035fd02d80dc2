"""Risk-sensitive acting (``agent.act_by``, issue 19 item 8): the collect step, the trainer's evaluation
and a policy file choose by CVaR or mean - lambda std of the learned return distribution; ``mean``
keeps the expected-Q kernels and their bits.

Each test gives the head a distribution by hand (the last layer's weights 0, its bias the
distribution): action 0 a sure small return, action 1 a larger mean with a 10% tail of -10 (mean
0.8, CVaR_0.1 -10, mean - std -2.8), action 2 the worst in every measure. The mean takes action 1;
CVaR at 0.1 and mean - 1 std take action 0."""

import numpy as np
import pytest
from test_trainer import gpu_small, small

from cudarl import backend as be
from cudarl.policy import Policy, PolicyState
from cudarl.reference import agent as ref
from cudarl.reference import qstats
from cudarl.trainer import Trainer

GREEDY = {"eps_start": 0.0, "eps_end": 0.0}
MEASURES = {"mean": {}, "cvar": {"act_alpha": 0.1}, "mean_std": {"act_lambda": 1.0}}
WANT = {"mean": 1, "cvar": 0, "mean_std": 0}


def _skewed_c51(t):
    """Logits [A, K] of the three distributions on the support (z_25 = 0, z_30 = 2, z_0 = -10), set as
    the dueling head's bias with V = the mean advantage (so the combine gives them back)."""
    K, A = t.cfg.net.atoms, t.cfg.env.n_actions
    lg = np.full((A, K), -40.0)
    lg[0, 26] = 0.0  # a sure 0.4
    lg[1, 30], lg[1, 0] = np.log(0.9), np.log(0.1)  # 0.9 at 2, 0.1 at -10
    lg[2, 0] = 0.0  # a sure -10
    net = t.agent.online
    bias = np.concatenate([lg.mean(0), lg.ravel()]).astype(np.float32)
    net.P["head.va.weight"][...] = 0
    net.P["head.va.bias"][...] = net.xp.asarray(bias)


def _skewed_quantiles(t):
    """Quantiles [N, A] (QR-DQN's fixed fractions): 0.4 everywhere; -10 in the first 10% of the cells and
    2 above; -10 everywhere."""
    N, A = t.cfg.net.n_quantiles, t.cfg.env.n_actions
    th = np.zeros((N, A), np.float32)
    th[:, 0] = 0.4
    th[:, 1] = 2.0
    th[: N // 10, 1] = -10.0
    th[:, 2] = -10.0
    net = t.agent.online
    net.P["head.out.weight"][...] = 0
    net.P["head.out.bias"][...] = net.xp.asarray(th.ravel())


def _collect_once(t):
    """One collection step: (actions, the values they were chosen by, the observations they saw)."""
    t._capture()
    t.synchronize()
    obs = t.env.obs.copy()
    t.collect_graph.replay()
    t.synchronize()
    return be.to_numpy(t.env.actions).copy(), be.to_numpy(t.agent.buffers.q_act).copy(), obs


def _trainer(head, measure, cfg=small, agent=None, **over):
    agent = {**GREEDY, "act_by": measure, **MEASURES[measure], **(agent or {})}
    net = {"head": head, "n_quantiles": 20} if head == "qrdqn" else {"head": head}
    return Trainer(cfg(agent=agent, net=net, **over), run_dir=False, echo=lambda m: None)


@pytest.mark.parametrize("head", ["c51", "qrdqn"])
@pytest.mark.parametrize("measure", ["mean", "cvar", "mean_std"])
def test_the_collect_step_evaluation_and_policy_act_by_the_measure(head, measure):
    t = _trainer(head, measure)
    (_skewed_c51 if head == "c51" else _skewed_quantiles)(t)
    actions, q, obs = _collect_once(t)
    assert (actions == WANT[measure]).all(), (measure, actions, q[0])
    # the values the collect step chose by, from the head's distribution with the twin
    want = np.empty_like(q)
    mode, alpha, lam = t.agent.rule.values.risk
    if head == "c51":
        logits = t.agent.online.forward(obs, t.agent.buffers.ws_act)["q"]
        if measure == "mean":  # today's act_c51: qstats.per_sample's expected Q, bit for bit
            want[...] = qstats.per_sample(logits, np.linspace(-10, 10, 51, dtype=np.float32))[0]
        else:
            ref.c51_risk(want, logits, np.linspace(-10, 10, 51, dtype=np.float32), mode, alpha, lam)
    else:
        theta = t.agent.online.forward(obs, t.agent.buffers.ws_act)["q"]
        if measure == "mean":
            ref.quantile_mean(want, theta)
        else:
            ref.quantile_risk(want, theta, mode, alpha, lam)
    np.testing.assert_array_equal(q, want)
    # evaluation (the trainer's greedy values) and a policy file's act the same way
    got = np.empty_like(q)
    t.agent.q_values(obs, got)
    np.testing.assert_array_equal(got, q)
    p = Policy(PolicyState.of_trainer(t), device="cpu")
    assert p.config.agent.act_by == measure and f"act_by={measure}" in repr(p)
    if p._q_rows() is None:
        np.testing.assert_array_equal(p.q_values(obs), q)
    else:  # C51 on the MLP: the evaluation walk's block Q (its own GEMM shape and expectation)
        np.testing.assert_array_equal(p.q_values(obs), p._q_rows()(obs))
        np.testing.assert_allclose(p.q_values(obs), q, rtol=1e-5, atol=1e-6)
    assert (p.act(obs) == WANT[measure]).all()
    if head == "c51":  # the host walk's blocks of bars give every row as the bar alone
        rows = p._q_rows()(obs)
        for i in range(len(obs)):
            one = np.empty((1, q.shape[1]), np.float32)
            p.q_values_into(obs[i : i + 1], one)
            np.testing.assert_array_equal(rows[i], one[0])


def test_iqn_cvar_acts_on_quantiles_at_fractions_below_alpha():
    """IQN's CVaR: the acting fractions (Philox, uniform in [0, 1)) are mapped into [0, alpha) before the
    forward, and the values are the mean of the quantiles there (Dabney et al. 2018); the mean keeps
    fractions over all of [0, 1) and the same draws."""
    taus = {}
    for measure in ("mean", "cvar"):
        t = _trainer("iqn", measure, agent={"act_alpha": 0.3})
        _, q, obs = _collect_once(t)
        ws = t.agent.buffers.ws_act
        taus[measure] = be.to_numpy(ws.rows("head.tau", t.env.n_envs)).copy()
        theta = be.to_numpy(t.agent.online.forward(obs, ws)["q"])  # at the acting taus, still in ws
        want = np.empty_like(q)
        ref.quantile_mean(want, theta)
        np.testing.assert_array_equal(q, want)
    assert taus["mean"].max() > 0.5 and taus["cvar"].max() < 0.3
    np.testing.assert_array_equal(taus["cvar"], taus["mean"] * np.float32(0.3))


def test_act_by_changes_training_and_mean_is_the_default():
    """A short run: act_by moves what is collected (so what is learned); "mean" is the default."""
    from cudarl.config import AgentConfig

    assert AgentConfig().act_by == "mean"
    runs = {}
    for measure in ("mean", "cvar"):
        t = _trainer("c51", measure, agent={"eps_start": 0.2, "eps_end": 0.2})
        t.run(30)
        runs[measure] = (t.losses, be.to_numpy(t.agent.online.params).copy())
    default = Trainer(small(agent={"eps_start": 0.2, "eps_end": 0.2}), run_dir=False, echo=lambda m: None)
    default.run(30)
    assert default.losses == runs["mean"][0]
    np.testing.assert_array_equal(be.to_numpy(default.agent.online.params), runs["mean"][1])
    assert not np.array_equal(runs["cvar"][1], runs["mean"][1])


def test_the_acting_observables_are_in_the_metrics_and_cvar_moves_them(tmp_path):
    """``act.value`` and ``act.disagreement`` (Agent.acting_observables) are in every step row of
    metrics.jsonl. With "mean" the disagreement is 0 by definition; CVaR at alpha 0.05 chooses otherwise
    than the mean in some environments and values its greedy action below the mean run's (the tail of a
    barely trained C51 distribution sits near v_min). An evaluation's forward over the acting workspace
    leaves the disagreement unknown (None) until the next collect step."""
    import json

    rows = {}
    for measure, alpha in (("mean", 0.25), ("cvar", 0.05)):
        over = {"eps_start": 0.2, "eps_end": 0.2, "act_alpha": alpha}
        t = Trainer(
            small(agent={"act_by": measure, **over}, run={"log_every": 10}),
            run_dir=tmp_path / measure,
            echo=lambda m: None,
        )
        t.run(30)
        lines = (tmp_path / measure / "metrics.jsonl").read_text().splitlines()
        rows[measure] = [r for r in map(json.loads, lines) if "loss" in r]
        assert [r["step"] for r in rows[measure]] == [10, 20, 30]
    assert all(r["act.disagreement"] == 0.0 for r in rows["mean"])
    assert any(r["act.disagreement"] > 0 for r in rows["cvar"])
    assert all(0 <= r["act.disagreement"] <= 1 for r in rows["cvar"])
    assert all(c["act.value"] < m["act.value"] for c, m in zip(rows["cvar"], rows["mean"], strict=True))
    obs = t.env.obs.copy()
    t.agent.q_values(obs, np.zeros((len(obs), t.env.n_actions), np.float32))
    assert t.agent.acting_observables()["act.disagreement"] is None
    t.collect_graph.replay()
    t.agent.collected()
    assert t.agent.acting_observables()["act.disagreement"] is not None


def test_act_by_is_validated():
    from cudarl.config import ConfigError, from_dict

    for bad, match in (
        ({"act_by": "median"}, "act_by"),
        ({"act_alpha": 0.0}, "act_alpha"),
        ({"act_alpha": 1.5}, "act_alpha"),
        ({"act_lambda": -1.0}, "act_lambda"),
    ):
        with pytest.raises(ConfigError, match=match):
            from_dict({"agent": bad})


@pytest.mark.gpu
@pytest.mark.parametrize("head", ["c51", "qrdqn", "iqn"])
@pytest.mark.parametrize("measure", ["mean", "cvar", "mean_std"])
def test_gpu_risk_acting_in_the_collect_graph(head, measure):
    """On the GPU the captured collect step acts by the measure: the skewed heads choose as on the
    CPU (C51, QR-DQN), q_act is the risk kernel's (or today's expected-Q kernel's) bits on the same head
    outputs, and a policy of the trainer's weights gives the same values."""
    import cupy as cp

    t = _trainer(head, measure, cfg=gpu_small)
    if head != "iqn":
        (_skewed_c51 if head == "c51" else _skewed_quantiles)(t)
    actions, q, obs = _collect_once(t)
    if head != "iqn":
        assert (actions == WANT[measure]).all(), (measure, actions[:8])
    values = t.agent.rule.values
    want = cp.empty((t.env.n_envs, t.cfg.env.n_actions), cp.float32)
    ws = t.agent.buffers.ws_act
    out = t.agent.online.forward(obs, ws)["q"]  # the acting taus stay in ws (IQN)
    if head == "c51":
        values.of_logits(out, want)
    else:
        values.of_quantiles(out, want)
    np.testing.assert_array_equal(q, want.get())
    p = Policy(PolicyState.of_trainer(t), device="gpu")
    if head != "iqn":  # (IQN's policy draws its own acting taus from the saved counter)
        np.testing.assert_array_equal(p.q_values(obs).get(), q)
