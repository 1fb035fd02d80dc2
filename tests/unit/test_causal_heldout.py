"""``causal``'s held-out sensitivity (:mod:`cudarl.auxiliary.causal_heldout`): the function against a direct
computation, the flat-position observations against the evaluation env's, and the summary key through the
trainer's evaluation, a policy file's and ``cudarl-train evaluate``. CPU (NumPy backend)."""

import numpy as np
import pytest
from test_aux_reg import _trainer

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
