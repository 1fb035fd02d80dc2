"""TradingEnv and EnvConfig: validation with clear messages, buffers, and state round trips."""

import numpy as np
import pytest

from cudarl.env import EnvConfig, TradingEnv

F32 = np.float32


def market(t_n=50, f_n=3):
    close = np.linspace(10, 12, t_n).astype(F32)
    return close * F32(1.001), close, np.ones((t_n, f_n), F32), np.zeros(f_n, bool)


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(n_envs=0), "n_envs"),
        (dict(episode_len=0), "episode_len"),
        (dict(n_actions=1), "n_actions"),
        (dict(fill="vwap"), "fill"),
        (dict(cost_bps=-1), "cost_bps"),
        (dict(slippage_bps=float("nan")), "slippage_bps"),
        (dict(hold_cap=0), "hold_cap"),
        (dict(seed=-1), "seed"),
        (dict(n_actions=3, levels=(0.0, 1.0)), "levels"),
        (dict(n_actions=3, levels=(1.0, 0.0, -1.0)), "increasing"),
        (dict(n_actions=3, levels=(-0.5, 0.0, 1.0), mirror=True), "antisymmetric"),
    ],
)
def test_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        EnvConfig(**kw)


def test_config_levels_and_rows():
    assert EnvConfig().rows_per_step == 1
    assert EnvConfig(n_actions=5, counterfactual=True).rows_per_step == 5
    assert EnvConfig(n_actions=5, counterfactual=True, mirror=True).rows_per_step == 6
    assert EnvConfig(mirror=True).rows_per_step == 2
    np.testing.assert_array_equal(EnvConfig(n_actions=3, levels=(0.0, 0.5, 1.0)).position_levels(), [0, 0.5, 1])


def test_input_validation_names_the_problem():
    open_, close, feats, sign = market()
    cfg = EnvConfig(n_envs=2, episode_len=10)
    bad = open_.copy()
    bad[7] = np.nan
    with pytest.raises(ValueError, match="open: bar 7"):
        TradingEnv(bad, close, feats, sign, cfg, backend="numpy")
    bad = close.copy()
    bad[3] = 0
    TradingEnv(open_, bad, feats, sign, cfg, backend="numpy")  # close is not traded with fill="open"
    with pytest.raises(ValueError, match="close: bar 3"):
        TradingEnv(open_, bad, feats, sign, EnvConfig(n_envs=2, episode_len=10, fill="close"), backend="numpy")
    f = feats.copy()
    f[9, 2] = np.inf
    with pytest.raises(ValueError, match="row 9, column 2"):
        TradingEnv(open_, close, f, sign, cfg, backend="numpy")
    with pytest.raises(ValueError, match="return_sign"):
        TradingEnv(open_, close, feats, np.zeros(4, bool), cfg, backend="numpy")
    with pytest.raises(ValueError, match="return_sign"):
        TradingEnv(open_, close, feats, np.zeros(3), cfg, backend="numpy")
    with pytest.raises(ValueError, match=r"\[T\]"):
        TradingEnv(open_[:-1], close, feats, sign, cfg, backend="numpy")
    with pytest.raises(ValueError, match="at least 12"):
        TradingEnv(open_, close, feats, sign, cfg, t_begin=40, backend="numpy")
    with pytest.raises(ValueError, match="t_begin"):
        TradingEnv(open_, close, feats, sign, cfg, t_begin=30, t_end=20, backend="numpy")
    with pytest.raises(ValueError, match="2-d"):
        TradingEnv(open_, close, feats[:, 0], sign, cfg, backend="numpy")


def test_buffers_and_default_actions():
    open_, close, feats, sign = market(f_n=4)
    env = TradingEnv(open_, close, feats, sign, EnvConfig(n_envs=5, episode_len=10), backend="numpy")
    assert env.obs.shape == (5, 6) and env.obs.dtype == F32 and env.obs_dim == 6
    assert env.actions.dtype == np.int32 and env.scale.dtype == F32 and np.all(env.scale == 1)
    obs_id = id(env.obs)
    env.act(np.tile(np.array([0, 0, 1], F32), (5, 1)), np.array([0.0], F32))
    np.testing.assert_array_equal(env.actions, 2)
    env.step()  # uses env.actions
    np.testing.assert_array_equal(env.state.position, 1)
    assert id(env.obs) == obs_id  # written in place


def test_state_dict_resumes_exactly(rng):
    open_ = (100 * np.exp(np.cumsum(rng.normal(0, 0.01, 300)))).astype(F32)
    feats = rng.normal(size=(300, 4)).astype(F32)
    cfg = EnvConfig(n_envs=17, episode_len=9, counterfactual=True, mirror=True, seed=4)
    a = TradingEnv(open_, open_, feats, np.array([1, 0, 0, 1], bool), cfg, backend="numpy")
    eps = np.array([0.5], F32)
    qs = [rng.normal(size=(17, 3)).astype(F32) for _ in range(30)]
    for q in qs[:10]:
        a.act(q, eps)
        a.step()
    sd = a.state_dict()
    b = TradingEnv(open_, open_, feats, np.array([1, 0, 0, 1], bool), cfg, backend="numpy")
    b.load_state_dict(sd)
    out_a, out_b = a.make_transitions(), b.make_transitions()
    for q in qs[10:]:
        for env, out in ((a, out_a), (b, out_b)):
            env.act(q, eps)
            env.record(out)
            env.step()
        np.testing.assert_array_equal(a.obs, b.obs)
        np.testing.assert_array_equal(a.reward, b.reward)
        for x, y in zip(out_a, out_b, strict=True):
            np.testing.assert_array_equal(x, y)
    sd.pop("state.count")
    with pytest.raises(KeyError, match="state.count"):
        b.load_state_dict(sd)
