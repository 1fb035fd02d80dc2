"""cudarl.gym: Gymnasium's env checker, truncated episode ends, the vector env's SAME_STEP autoreset."""

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium", reason="the gym extra is not installed (pip install 'cudarl[gym]')")

import cudarl.gym as cgym  # noqa: E402
from cudarl.env import TradingEnv  # noqa: E402

DATA = "builtin:regime?n=1500"


def test_gymnasiums_env_checker_passes():
    from gymnasium.utils.env_checker import check_env

    env = cgym.make(DATA, episode_len=64, cost_bps=2.0)
    check_env(env, skip_render_check=True)
    assert env.observation_space.shape == (env.market.env.obs_dim,) and env.action_space.n == 3


def test_an_episode_ends_truncated_with_its_last_observation():
    env = cgym.make(DATA, episode_len=5)
    obs, _ = env.reset(seed=3)
    seen = [obs]
    for k in range(5):
        obs, r, terminated, truncated, _ = env.step(2)
        assert not terminated and truncated == (k == 4) and np.isfinite(r)
        seen.append(obs)
    t = [np.flatnonzero((env.market.prepared.x == o[:-2]).all(1)) for o in seen]
    assert all(len(x) for x in t) and np.diff([x[0] for x in t]).tolist() == [1] * 5  # consecutive bars
    assert seen[-1][-2] == 1.0  # long: the position held entering the bar after the last step
    again, _ = env.reset(seed=3)
    np.testing.assert_array_equal(again, seen[0])  # a seed repeats an episode
    other, _ = env.reset(seed=4)
    assert not np.array_equal(other, seen[0])


def test_unknown_options_are_refused():
    with pytest.raises(TypeError, match="episode_length"):
        cgym.make(DATA, episode_length=5)


def test_vector_env_steps_like_the_trading_env_and_autoresets_in_the_same_step():
    n, L = 6, 8
    envs = cgym.make_vec(DATA, n, backend="cpu", episode_len=L, stagger=True, seed=11)
    assert envs.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.SAME_STEP
    obs, _ = envs.reset()
    m = envs.market
    ref = TradingEnv(m.prepared.bars.open, m.prepared.bars.close, m.prepared.x, m.prepared.sign, m.env.config,
                     t_begin=m.split.start, t_end=m.split.stop, backend="numpy")  # fmt: skip
    np.testing.assert_array_equal(obs, ref.obs)
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(3 * L):
        a = rng.integers(0, 3, n)
        before = ref.obs.copy()
        obs, reward, terminated, truncated, infos = envs.step(a)
        ref.actions[...] = a
        ref.step()
        np.testing.assert_array_equal(obs, ref.obs)
        np.testing.assert_array_equal(reward, ref.reward.astype(np.float64))
        assert not terminated.any()
        np.testing.assert_array_equal(truncated, ref.done > 0)
        if truncated.any():
            ended += int(truncated.sum())
            np.testing.assert_array_equal(infos["_final_obs"], truncated)
            for i in np.flatnonzero(truncated):
                fin = infos["final_obs"][i]
                assert fin[-2] == ref.config.position_levels()[a[i]]  # the last step's position ...
                assert not np.array_equal(fin, obs[i]) and obs[i][-1] == 0.0  # ... and a fresh episode
                assert fin.shape == before[i].shape
        else:
            assert "final_obs" not in infos
    assert ended >= n  # every env ended at least once
