"""``causal``'s held-out sensitivity (:mod:`cudarl.auxiliary.causal_heldout`): the function against a direct
computation, the flat-position observations against the evaluation env's, and the summary key through the
trainer's evaluation, a policy file's and ``cudarl-train evaluate``. CPU (NumPy backend)."""

import json

import numpy as np
import pytest
from test_aux_reg import _trainer
from test_windows import ENCODER_NETS

from cudarl.auxiliary.causal_heldout import FlatObservations, heldout_sensitivity
from cudarl.reference.window import N_POSITION_FEATURES

KEY = "causal_sensitivity_heldout"
ALL_GROUPS = ["calendar", "level", "offset"]


def _tiny_q(obs_dim: int, seed: int = 0):
    """A two-layer ReLU network, float64 inside: ``q(x [k, obs_dim]) -> [k, 3]``."""
    rng = np.random.default_rng(seed)
    w1, b1 = rng.normal(size=(obs_dim, 16)), rng.normal(size=16)
    w2 = rng.normal(size=(16, 3))
    return lambda x: np.maximum(np.asarray(x, np.float64) @ w1 + b1, 0) @ w2


def _by_hand(q, obs, cols, window, offset=None):
    """mean |Q(x') - Q(x)| with x' built directly: ``cols`` of every bar taken from the next row (a swap), or
    every feature column shifted by ``offset``."""
    n = obs.shape[0]
    v = obs.reshape(n, window, -1)
    x = v.copy()
    if offset is None:
        for b in range(n):
            x[b, :, cols] = v[(b + 1) % n, :, cols]
    else:
        x[:, :, cols] += np.float32(offset)
    return float(np.mean(np.abs(q(x.reshape(n, -1)) - q(obs))))


@pytest.mark.parametrize("chunk", [1, 3, 7, 1024])
@pytest.mark.parametrize("window", [1, 3])
def test_the_sensitivity_is_the_mean_absolute_change_of_q_under_each_groups_intervention(chunk, window):
    names = ["ret_1", "dow_sin", "level_20", "hod_cos", "log_vol"]
    F = len(names)
    n, C = 11, F + N_POSITION_FEATURES
    rng = np.random.default_rng(1)
    obs = rng.normal(size=(n, window * C)).astype(np.float32)
    q = _tiny_q(window * C)
    got = heldout_sensitivity(q, obs, names, ALL_GROUPS, window, 0.5, chunk=chunk)
    want = {
        "calendar": _by_hand(q, obs, [1, 3], window),
        "level": _by_hand(q, obs, [2], window),
        "offset": _by_hand(q, obs, list(range(F)), window, offset=0.5),
    }
    assert list(got) == ALL_GROUPS
    for g in ALL_GROUPS:
        assert want[g] > 0
        np.testing.assert_allclose(got[g], want[g], rtol=1e-12)
    # a group without a column is left out; the lazy view gives the same numbers as the array
    no_level = [m for m in names if not m.startswith("level_")] + ["range"]
    assert list(heldout_sensitivity(q, obs, no_level, ALL_GROUPS, window, 0.5, chunk=chunk)) == ["calendar", "offset"]


def test_the_flat_observations_are_the_evaluation_envs_windows_at_the_flat_position():
    from cudarl.policy import eval_env
    from cudarl.reference.env import write_state

    t = _trainer(net={"window": 5})
    split = t.data.splits.val
    n = len(split) - 2
    env = eval_env(t.data, split, t.cfg.env, "numpy")
    rows = np.zeros((n, env.windows.state_dim), np.float32)
    write_state(rows, split.start + np.arange(n), np.zeros(n, np.float32), np.zeros(n), env.params.hold_cap)
    want = env.windows.of(rows)
    obs = FlatObservations(t.data.x, split.start, n, 5)
    assert obs.shape == want.shape
    np.testing.assert_array_equal(obs[0:n], want)
    np.testing.assert_array_equal(obs[3:9], want[3:9])
    assert not want[:, -N_POSITION_FEATURES:].any()  # position 0, hold 0
    assert want[0, : len(t.data.names)].any()  # the first decision bar's window reaches back before the split


@pytest.mark.parametrize("head", ["c51", "iqn"])
@pytest.mark.parametrize("encoder", ["mlp", "ssm", "attention"])
def test_the_trainers_evaluation_lists_each_groups_heldout_sensitivity(encoder, head):
    agent = {"aux": ["causal"], "causal_groups": ALL_GROUPS}
    t = _trainer(net={**ENCODER_NETS[encoder], "head": head}, agent=agent)
    t.run(6)
    summary = t.evaluate("val", write=False)
    got = summary[KEY]
    assert list(got) == ["calendar", "offset"]  # "level" has no column in the default features
    assert all(np.isfinite(v) and v > 0 for v in got.values()), got
    assert list(summary["causal_sensitivity"]) == ["calendar", "offset"]  # the training-time one stays
    if head == "c51":  # the same numbers through another forward: the acting one, n_envs rows at a time
        q = _acting_q(t)
        split = t.data.splits.val
        obs = FlatObservations(t.data.x, split.start, len(split) - 2, t.cfg.net.window)
        want = heldout_sensitivity(q, obs, t.data.names, ALL_GROUPS, t.cfg.net.window, 0.5, chunk=t.cfg.env.n_envs)
        for g in got:
            np.testing.assert_allclose(got[g], want[g], rtol=1e-4)
    assert KEY not in _trainer(net=ENCODER_NETS[encoder]).evaluate("val", write=False)


def _acting_q(t):
    def q(x):
        out = np.empty((x.shape[0], t.cfg.env.n_actions), np.float32)
        t.agent.q_values(np.ascontiguousarray(x), out)
        return out

    return q


@pytest.mark.parametrize("encoder", ["mlp", "ssm", "attention"])
def test_a_network_blind_to_the_calendar_has_calendar_sensitivity_zero_and_offset_not(encoder):
    agent = {"aux": ["causal"], "causal_groups": ["calendar", "offset"]}
    t = _trainer(net=ENCODER_NETS[encoder], agent=agent)
    t.run(6)
    before = t.evaluate("val", write=False)[KEY]
    assert before["calendar"] > 0 and before["offset"] > 0
    names = t.data.names
    calendar = [j for j, m in enumerate(names) if m.startswith(("dow_", "hod_"))]
    assert calendar
    C, W = len(names) + N_POSITION_FEATURES, t.cfg.net.window
    if encoder == "mlp":  # the first layer reads [window * (F + 2)] columns: those of every bar
        w, rows = t.agent.online.P["enc.0.weight"], [w * C + j for w in range(W) for j in calendar]
    else:  # the embedding reads each bar's F + 2 columns
        w, rows = t.agent.online.P["enc.embed.weight"], calendar
    w[rows] = 0
    after = t.evaluate("val", write=False)[KEY]
    assert after["calendar"] == 0.0
    assert after["offset"] > 0


@pytest.mark.parametrize("encoder", ["mlp", "ssm"])
@pytest.mark.parametrize("avg", [0, 10])
def test_a_policy_files_evaluation_lists_the_heldout_sensitivity_the_trainers_evaluation_lists(tmp_path, encoder, avg):
    """``Policy.evaluate`` and ``cudarl-train evaluate`` (its summary.json) list ``causal_sensitivity_heldout``
    with the numbers of the trainer's evaluation of the same weights (the moving average where it deploys);
    a policy without ``causal`` lists none."""
    from typer.testing import CliRunner

    from cudarl.cli import app
    from cudarl.policy import load_policy

    agent = {"aux": ["causal"], "causal_groups": ALL_GROUPS}
    t = _trainer(tmp_path, net=ENCODER_NETS[encoder], agent=agent, eval={"average_halflife": avg})
    t.run(20)
    want = t.evaluate("val", write=False)[KEY]
    assert list(want) == ["calendar", "offset"]
    last = t._evaluation("val", averaged=False, heldout=True).summary[KEY]  # the last weights'
    assert (last == want) == (avg == 0)  # with the average, its numbers, not the live weights'
    path = t.save_policy("causal")
    got = load_policy(path, device="cpu").evaluate(split="val").summary
    assert got[KEY] == want
    out = tmp_path / "ev"
    r = CliRunner().invoke(app, ["evaluate", str(path), "--split", "val", "--device", "cpu", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads((out / "summary.json").read_text())[KEY] == want
    plain = _trainer(tmp_path / "plain")
    plain.run(5)
    assert KEY not in load_policy(plain.save_policy("plain"), device="cpu").evaluate(split="val").summary
