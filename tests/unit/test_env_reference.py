"""The env's NumPy twin: hand-computed cases, the cost model, episodes, and acting statistics."""

import numpy as np
import pytest
from scipy import stats

from cudarl import costs
from cudarl.env import EnvConfig, TradingEnv
from cudarl.reference import env as ref
from cudarl.reference import philox

F32 = np.float32


def flat_market(t_n=40, f_n=3):
    px = np.linspace(100, 120, t_n).astype(F32)
    feats = np.arange(t_n * f_n, dtype=F32).reshape(t_n, f_n)
    return px * F32(0.999), px, feats, np.array([True] + [False] * (f_n - 1))


def test_bar_returns_hand_case():
    open_ = np.array([10, 11, 12, 15, 9], F32)
    close = np.array([20, 22, 11, 22, 44], F32)
    head = np.array([12, 15, 9], F32) / np.array([11, 12, 15], F32) - F32(1)  # float32, op by op
    np.testing.assert_array_equal(ref.bar_returns(open_, close, "open"), np.concatenate([head, [0, 0]]).astype(F32))
    np.testing.assert_allclose(head, [12 / 11 - 1, 15 / 12 - 1, 9 / 15 - 1], rtol=1e-6)
    np.testing.assert_array_equal(ref.bar_returns(open_, close, "close"), np.array([-0.5, 1.0, 1.0, 0, 0], F32))
    with pytest.raises(ValueError, match="fill"):
        ref.bar_returns(open_, close, "mid")


def test_position_levels_are_antisymmetric():
    np.testing.assert_array_equal(ref.position_levels(3), np.array([-1, 0, 1], F32))
    np.testing.assert_array_equal(ref.position_levels(2), np.array([-1, 1], F32))
    for a in range(2, 12):
        lv = ref.position_levels(a)
        assert lv.dtype == F32 and np.all(np.diff(lv) > 0) and lv[0] == -1 and lv[-1] == 1
        np.testing.assert_array_equal(lv[::-1], -lv)
    with pytest.raises(ValueError):
        ref.position_levels(1)


def test_reward_is_the_shared_cost_model_bitwise(rng):
    params = ref.EnvParams(0, 1, 1, 1, False, 2.7, 1.3, 0, False, False)
    prev, p, r = (rng.normal(size=10_000).astype(F32) for _ in range(3))
    got = ref.reward(prev, p, r, params)
    assert got.dtype == F32
    np.testing.assert_array_equal(got, costs.bar_net_return(prev, p, r, 2.7, 1.3))
    # the kernels' op-by-op float32 formula with the float32 rate they receive
    np.testing.assert_array_equal(got, (p * r - params.rate * np.abs(p - prev)).astype(F32))
    r64 = ref.reward(prev, p, r, params, compute_dtype=np.float64)
    assert r64.dtype == np.float64 and np.max(np.abs(r64 - got)) < 1e-6


def test_step_hand_case():
    """Flat -> long -> long -> short over known bars, cost 10 bps + slippage 5 bps."""
    open_ = np.array([100, 100, 101, 102, 100, 99, 98, 97, 96, 95], F32)
    close = open_.copy()
    feats = np.arange(10, dtype=F32).reshape(10, 1)
    cfg = EnvConfig(n_envs=1, episode_len=4, cost_bps=10, slippage_bps=5, stagger=False, hold_cap=2)
    env = TradingEnv(open_, close, feats, np.array([True]), cfg, t_begin=0, t_end=6, backend="numpy")
    assert env.params.n_starts == 1 and env.state.t[0] == 0 and env.state.steps_left[0] == 4
    np.testing.assert_array_equal(env.obs, [[0, 0, 0]])
    rate = F32(15e-4)
    expected = []
    for a, (t, prev, p) in zip([2, 2, 0, 1], [(0, 0, 1), (1, 1, 1), (2, 1, -1), (3, -1, 0)], strict=True):
        env.step(np.array([a], np.int32))
        ret = F32(open_[t + 2] / open_[t + 1] - F32(1))
        expected.append(F32(F32(p) * ret - rate * F32(abs(p - prev))))
        assert env.reward[0] == expected[-1], (t, env.reward[0], expected[-1])
    # the 4th step ended the episode: done, reset flat at the only start
    assert env.done[0] == 1 and env.state.t[0] == 0 and env.state.position[0] == 0 and env.state.hold[0] == 0
    assert env.state.count[0] == 4
    np.testing.assert_allclose(expected, [0.01 - 15e-4, 102 / 101 - 1, -(100 / 102 - 1) - 2 * 15e-4, -15e-4], rtol=1e-5)


def test_hold_feature_and_obs_layout():
    open_, close, feats, sign = flat_market()
    cfg = EnvConfig(n_envs=1, episode_len=20, stagger=False, hold_cap=3)
    env = TradingEnv(open_, close, feats, sign, cfg, backend="numpy")
    holds = []
    for a in [2, 2, 2, 2, 2, 0, 0]:
        t = int(env.state.t[0])
        env.step(np.array([a], np.int32))
        np.testing.assert_array_equal(env.obs[0, :3], feats[t + 1])
        holds.append(float(env.obs[0, 4]))
        assert env.obs[0, 3] == ref.position_levels(3)[a]
    np.testing.assert_allclose(holds, [1 / 3, 2 / 3, 1, 1, 1, 1 / 3, 2 / 3], rtol=1e-7)


@pytest.mark.parametrize("stagger", [False, True])
def test_episodes_stay_in_the_window_and_reset_on_time(rng, stagger):
    open_, close, feats, sign = flat_market(t_n=60)
    cfg = EnvConfig(n_envs=64, episode_len=7, stagger=stagger, seed=11)
    env = TradingEnv(open_, close, feats, sign, cfg, t_begin=5, t_end=50, backend="numpy")
    last_t = 50 - 3
    if stagger:
        assert len(np.unique(env.state.steps_left)) > 3
    else:
        assert np.all(env.state.steps_left == 7)
    starts = []
    for _ in range(200):
        left = env.state.steps_left.copy()
        assert np.all((env.state.t >= 5) & (env.state.t <= last_t))
        assert np.all(env.state.t - env.state.start + env.state.steps_left <= 7)
        env.step(rng.integers(0, 3, 64).astype(np.int32))
        np.testing.assert_array_equal(env.done, (left == 1).astype(F32))
        ended = env.done == 1
        assert np.all(env.state.position[ended] == 0) and np.all(env.state.hold[ended] == 0)
        assert np.all(env.state.steps_left[ended] == 7)
        starts.extend(env.state.start[ended].tolist())
    starts = np.array(starts)
    assert starts.min() >= 5 and starts.max() <= 50 - 7 - 2
    # starts are uniform over the n_starts = 37 possible bars: chi-square, p > 1e-4
    counts = np.bincount(starts - 5, minlength=env.params.n_starts)
    assert counts.size == 37 and stats.chisquare(counts).pvalue > 1e-4


def test_reset_draws_follow_the_documented_philox_layout():
    open_, close, feats, sign = flat_market(t_n=100)
    cfg = EnvConfig(n_envs=6, episode_len=10, seed=2**40 + 3)
    env = TradingEnv(open_, close, feats, sign, cfg, t_begin=4, backend="numpy")
    n_starts = 100 - 4 - 10 - 1
    for i in range(6):
        x = philox.blocks(cfg.seed, 0, ref.STREAM_RESET, np.array([i // 2]))[0]
        assert env.state.t[i] == 4 + (int(x[2 * (i % 2)]) * n_starts >> 32)
        assert env.state.steps_left[i] == 1 + (int(x[2 * (i % 2) + 1]) * 10 >> 32)
    first = env.state.t.copy()
    env.reset()  # same counters: same draws
    np.testing.assert_array_equal(env.state.t, first)
    env.step()
    env.reset()  # counters moved: new draws
    assert not np.array_equal(env.state.t, first)


def test_act_greedy_takes_the_first_maximum():
    q = np.array([[1, 3, 3], [5, 5, 5], [-1, -2, -3], [0, 0, 7]], F32)
    seed = np.array([1], np.uint64)
    out = np.full(4, -1, np.int32)
    ref.act(out, q, np.array([0.0], F32), np.arange(4, dtype=np.uint64), seed)
    np.testing.assert_array_equal(out, [1, 0, 0, 2])


def test_act_explores_at_rate_epsilon_uniformly():
    n, a_n, eps = 40_000, 4, 0.3
    q = np.tile(np.array([0, 0, 0, 1], F32), (n, 1))  # greedy is always action 3
    seed = np.array([5], np.uint64)
    out = np.zeros(n, np.int32)
    ref.act(out, q, np.array([eps], F32), np.full(n, 17, np.uint64), seed)
    # actions 0..2 only come from exploration: each has probability eps / 4
    counts = np.bincount(out, minlength=a_n)
    expected = np.array([eps / 4] * 3 + [1 - 3 * eps / 4]) * n
    assert stats.chisquare(counts, expected).pvalue > 1e-4
    same = np.zeros(n, np.int32)
    ref.act(same, q, np.array([eps], F32), np.full(n, 17, np.uint64), seed)
    np.testing.assert_array_equal(same, out)  # deterministic in (seed, counter)
    ref.act(same, q, np.array([eps], F32), np.full(n, 18, np.uint64), seed)
    assert not np.array_equal(same, out)


def test_conviction_scales_the_position_and_its_cost(rng):
    open_, close, feats, sign = flat_market()
    cfg = EnvConfig(n_envs=3, episode_len=20, stagger=False, cost_bps=10)
    env = TradingEnv(open_, close, feats, sign, cfg, backend="numpy")
    t = env.state.t.copy()
    scale = np.array([1.0, 0.5, 0.0], F32)
    env.step(np.array([2, 2, 2], np.int32), scale)
    np.testing.assert_array_equal(env.state.position, scale)
    ret = env.data.ret[t]
    np.testing.assert_array_equal(env.reward, (scale * ret - F32(1e-3) * scale).astype(F32))


def test_out_of_range_actions_are_clamped():
    open_, close, feats, sign = flat_market()
    env = TradingEnv(open_, close, feats, sign, EnvConfig(n_envs=2, episode_len=20), backend="numpy")
    env.step(np.array([-5, 99], np.int32))
    np.testing.assert_array_equal(env.state.position, [-1, 1])
