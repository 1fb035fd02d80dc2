"""Gymnasium environments over market bars (``pip install 'cudarl[gym]'``).

    env = cudarl.gym.make("builtin:regime", episode_len=256, cost_bps=1.0)      # gymnasium.Env
    envs = cudarl.gym.make_vec("spx.csv", num_envs=4096, data_options={"sort": True})  # VectorEnv

Both walk the bars of one split (``split="train"`` by default) of the data, with cudarl's causal
features normalised on the training split, exactly as :class:`cudarl.TradingEnv` does for the
trainer (the semantics: docs/env.md). Observations are float32 ``[window * (F + 2)]``: ``window``
bars of features, oldest first, then the position held and the hold fraction on the newest bar (zeros
on the others; ``window=1`` by default: ``[features, position, hold]``); actions are
``Discrete(n_actions)`` target positions from short to long; the reward
is the bar's net return of the position after costs.

An episode ends after ``episode_len`` steps. The market goes on, so the end is a truncation
(``truncated=True``, ``terminated=False``): bootstrap from the final observation.

:func:`make_vec` steps every environment in one call of the env kernels (CuPy on a GPU by default)
and resets ended episodes on the spot, which is Gymnasium's ``SAME_STEP`` autoreset mode: the
observation returned for an ended episode is the first of the next, and the final observation is
in ``infos["final_obs"]`` (with the mask ``infos["_final_obs"]``).
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np

try:
    import gymnasium
    from gymnasium import spaces
    from gymnasium.vector import AutoresetMode, VectorEnv
    from gymnasium.vector.utils import batch_space
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("cudarl.gym needs gymnasium: pip install 'cudarl[gym]'") from exc

from . import backend as _backend
from .config import NetConfig as _NET
from .env import EnvConfig, TradingEnv

__all__ = ["make", "make_vec", "TradingGymEnv", "TradingVectorEnv"]

#: Options of :func:`make` that are not :class:`cudarl.env.EnvConfig` fields.
OWN_OPTIONS = ("split", "features", "data_options", "backend", "window")


def _market(data, split: str, features, data_options, env_options: dict, n_envs: int, backend, window: int):
    """``(prepared bars, the split, EnvConfig, backend name)`` for the options of :func:`make`."""
    from .config import Config, from_dict
    from .prepare import prepare_data

    known = {f.name for f in fields(EnvConfig)} - {"n_envs"}
    bad = sorted(set(env_options) - known)
    if bad:
        raise TypeError(f"unknown option(s) {bad}; cudarl.gym.make takes {sorted(known | set(OWN_OPTIONS))}")
    over = {
        "data": dict(data_options or {}),
        "env": {"stagger": False, **env_options, "n_envs": n_envs},
        "net": {"window": window},
    }
    if isinstance(data, str):
        over["data"]["source"] = data
    if features:
        over["features"] = dict(features)
    cfg = from_dict(over, base=Config())
    prepared = prepare_data(cfg, None if isinstance(data, str) else data)
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be train, val or test, got {split!r}")
    be = _backend.get({"auto": None, "gpu": "cupy", "cpu": "numpy", "numpy": "numpy", "cupy": "cupy"}[backend])
    return prepared, getattr(prepared.splits, split), cfg.env, be.name


class _Market:
    """A :class:`TradingEnv` over one split that can be rebuilt with a new seed (Gymnasium's reset(seed))."""

    def __init__(self, prepared, split, env_cfg: EnvConfig, backend: str):
        self.prepared, self.split, self.cfg, self.backend = prepared, split, env_cfg, backend
        self.build(env_cfg.seed)

    def build(self, seed: int) -> None:
        p, s = self.prepared, self.split
        self.env = TradingEnv(
            p.bars.open,
            p.bars.close,
            p.x,
            p.sign,
            replace(self.cfg, seed=int(seed)),
            t_begin=s.start,
            t_end=s.stop,
            window=p.window,
            backend=self.backend,
        )
        self.transitions = self.env.make_transitions()

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(obs [N, D], reward [N], done [N] bool, final obs [N, D])`` after one step of every env."""
        env, xp = self.env, self.env.xp
        env.actions[...] = xp.asarray(np.asarray(actions, dtype=np.int64).reshape(-1).astype(np.int32))
        env.record(self.transitions)  # the true next observation, before an ended episode resets
        env.step()
        to = _backend.to_numpy
        final = to(env.windows.of(self.transitions.next_obs[: env.n_envs]))  # state rows -> observations
        return to(env.obs).copy(), to(env.reward).astype(np.float64), to(env.done) > 0, final


def _space(market: _Market):
    """Box bounds of an observation, per bar of the window: the normaliser's clip, the positions' range,
    the hold fraction (both 0 except on the newest bar, inside those ranges)."""
    clip = market.prepared.normaliser.clip
    f, w = market.env.n_features, market.env.window
    lv = market.cfg.position_levels()
    low = np.concatenate([np.full(f, -clip), [min(float(lv.min()), 0.0), 0.0]]).astype(np.float32)
    high = np.concatenate([np.full(f, clip), [max(float(lv.max()), 0.0), 1.0]]).astype(np.float32)
    return spaces.Box(np.tile(low, w), np.tile(high, w), dtype=np.float32)


def _seed_from(seed) -> int:
    return int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0])


class TradingGymEnv(gymnasium.Env):
    """One trading environment as a ``gymnasium.Env`` (see the module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, market: _Market):
        self.market = market
        self.observation_space = _space(market)
        self.action_space = spaces.Discrete(market.env.n_actions)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.market.build(_seed_from(seed))
        else:
            self.market.env.reset()
        return _backend.to_numpy(self.market.env.obs)[0].copy(), {}

    def step(self, action):
        obs, reward, done, final = self.market.step([int(action)])
        if done[0]:  # the env already began the next episode; Gymnasium wants the last observation
            return final[0], float(reward[0]), False, True, {}
        return obs[0], float(reward[0]), False, False, {}


class TradingVectorEnv(VectorEnv):
    """``num_envs`` trading environments stepping together (see the module docstring)."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, market: _Market):
        self.market = market
        self.num_envs = market.env.n_envs
        self.single_observation_space = _space(market)
        self.single_action_space = spaces.Discrete(market.env.n_actions)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.market.build(_seed_from(seed))
        else:
            self.market.env.reset()
        return _backend.to_numpy(self.market.env.obs).copy(), {}

    def step(self, actions):
        obs, reward, done, final = self.market.step(actions)
        infos: dict = {}
        for i in np.flatnonzero(done):
            infos = self._add_info(infos, {"final_obs": final[i], "final_info": {}}, int(i))
        return obs, reward, np.zeros(self.num_envs, bool), done, infos


def make(
    data="builtin:regime",
    *,
    split="train",
    features=None,
    data_options=None,
    backend="cpu",
    window: int = _NET.window,
    **env_options,
):
    """A ``gymnasium.Env`` trading ``data`` (a CSV/Parquet path, ``builtin:<name>``, or
    :class:`cudarl.data.Bars`), observing ``window`` bars (``net.window``; module docstring).

    ``env_options``: fields of :class:`cudarl.env.EnvConfig` (``episode_len``, ``cost_bps``,
    ``fill``, ``n_actions``, ``seed``, ...; ``stagger`` defaults to False here). ``split``: which
    chronological split's bars to walk. ``features``: :class:`cudarl.features.FeatureConfig` fields.
    ``data_options``: ``data`` config fields (``sort``, ``dedupe``, ``columns``, ...).
    ``backend``: ``cpu`` (default: one env gains nothing from a GPU), ``gpu`` or ``auto``.
    """
    prepared, s, cfg, be = _market(data, split, features, data_options, env_options, 1, backend, window)
    return TradingGymEnv(_Market(prepared, s, cfg, be))


def make_vec(
    data="builtin:regime",
    num_envs: int = 16,
    *,
    split="train",
    features=None,
    data_options=None,
    backend="auto",
    window: int = _NET.window,
    **env_options,
):
    """A ``gymnasium.vector.VectorEnv`` of ``num_envs`` environments over ``data`` in one
    :class:`cudarl.TradingEnv` (the GPU one when usable: ``backend="auto"``); the options of :func:`make`.
    ``stagger=True`` spreads the first episodes' ends."""
    prepared, s, cfg, be = _market(data, split, features, data_options, env_options, int(num_envs), backend, window)
    return TradingVectorEnv(_Market(prepared, s, cfg, be))
