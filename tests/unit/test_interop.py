"""Stable-Baselines3's DQN trains on cudarl.gym.make (the interop extra: pip install 'cudarl[interop]')."""

import time

import numpy as np
import pytest

pytest.importorskip("gymnasium", reason="the gym extra is not installed (pip install 'cudarl[gym]')")
sb3 = pytest.importorskip(
    "stable_baselines3", reason="the interop extra is not installed (pip install 'cudarl[interop]')"
)

import cudarl.gym as cgym  # noqa: E402

#: TODO(coordinator): switch to "builtin:ar" once the built-in AR(1) market (another branch) lands.
INTEROP_DATA = "builtin:regime?n=3000"


def test_stable_baselines3_dqn_trains_on_cudarl_gym():
    import torch

    torch.set_num_threads(1)
    env = cgym.make(INTEROP_DATA, episode_len=200, cost_bps=1.0)
    from stable_baselines3.common.env_checker import check_env

    check_env(env, warn=True)
    model = sb3.DQN(
        "MlpPolicy",
        env,
        learning_starts=500,
        train_freq=4,
        target_update_interval=250,
        buffer_size=5000,
        policy_kwargs={"net_arch": [32, 32]},
        seed=0,
        device="cpu",
    )
    t0 = time.perf_counter()
    model.learn(total_timesteps=3000)
    assert model.num_timesteps == 3000 and time.perf_counter() - t0 < 120
    obs, _ = env.reset(seed=1)
    actions = []
    for _ in range(50):
        a, _ = model.predict(obs, deterministic=True)
        obs, r, terminated, truncated, _ = env.step(a)
        assert np.isfinite(r) and not terminated
        actions.append(int(a))
    assert set(actions) <= {0, 1, 2}
