"""``TradingEnv``: N trading environments stepping together on the device.

The env owns its device buffers and composes the ops of the ``env`` family
(``cudarl.ops.env`` on the GPU, ``cudarl.reference.env`` on the CPU); the semantics are in
``cudarl/reference/env.py`` and ``docs/env.md``. A collection step is::

    env.act(q, epsilon)        # epsilon-greedy from Q [N, A] -> env.actions
    env.record(transitions)    # optional: real + counterfactual + mirror rows, before the step
    env.step()                 # reward, done, next obs; ended episodes reset on the device

Observations are kept by reference: the env kernels write each env's state row (its bar and
position features, :mod:`cudarl.reference.window`) into :attr:`TradingEnv.rows`, and ``reset`` and
``step`` then gather the network's observation, the last ``window`` bars of features and the
position features, into :attr:`TradingEnv.obs` (:class:`cudarl.window.Windows`, one launch).
Transitions carry state rows too, so the replay stores bar indices, not windows.

Every call only launches kernels into buffers allocated at construction, so the sequence can
be captured by ``cudarl.graph.StepGraph``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import backend as _backend
from .backend import family
from .reference import env as ref
from .reference.env import EnvData, EnvParams, EnvState, Transitions
from .reference.window import STATE_DIM
from .window import Windows

F32 = np.float32

__all__ = ["EnvConfig", "TradingEnv", "Transitions", "EnvState", "stream_seed"]

#: Weyl increment (2^64 / golden ratio) that spreads run seeds over the 64-bit Philox keys.
_SEED_STRIDE = 0x9E3779B97F4A7C15


def stream_seed(run_seed: int, env_seed: int) -> int:
    """The Philox key of a run's environments: ``env_seed + run_seed * 0x9E3779B97F4A7C15 (mod 2**64)``.

    ``run.seed`` is the seed of everything a run draws, the environments' episode starts and exploration
    included (:class:`cudarl.trainer.Trainer` builds its environments with this key); ``env.seed`` shifts
    the environments' streams alone. ``run_seed = 0`` gives ``env_seed`` itself, so every run of the default
    seed keeps the bits it had when the environments read ``env.seed`` alone."""
    return (int(env_seed) + int(run_seed) * _SEED_STRIDE) % 2**64


@dataclass(frozen=True)
class EnvConfig:
    """How the environments trade. Validated at construction."""

    n_envs: int = 4096
    """Environments stepping together (>= 1)."""
    episode_len: int = 1024
    """Steps per episode (>= 1); the data window must hold ``episode_len + 2`` bars."""
    n_actions: int = 3
    """Target-position levels, evenly spaced from -1 (short) to +1 (long); 3 is short/flat/long."""
    levels: tuple[float, ...] | None = None
    """Explicit target positions instead of the even spacing (length ``n_actions``, increasing)."""
    fill: str = "open"
    """Where a decision made at close[t] is filled: ``"open"`` (open[t+1]) or ``"close"`` (close[t+1])."""
    cost_bps: float = 1.0
    """Commission per unit of position change, in basis points (``cudarl.costs``)."""
    slippage_bps: float = 0.0
    """Slippage per unit of position change, in basis points (``cudarl.costs``)."""
    hold_cap: int = 64
    """The hold feature ``min(hold, hold_cap) / hold_cap`` saturates here (>= 1)."""
    stagger: bool = True
    """Draw the first episode's length uniformly in [1, episode_len] so episode ends spread out."""
    counterfactual: bool = False
    """``record`` writes one row per other action (the prices do not depend on the agent)."""
    mirror: bool = False
    """``record`` writes the directional mirror row (needs antisymmetric levels)."""
    seed: int = 0
    """Philox seed of resets, episode starts and exploration (0 <= seed < 2**64). A trainer's environments
    combine it with ``run.seed`` (:func:`stream_seed`), so runs of different seeds draw different episodes
    and exploration; this field shifts the environments' streams alone."""

    def __post_init__(self):
        def need(ok, msg):
            if not ok:
                raise ValueError(f"EnvConfig: {msg}")

        need(int(self.n_envs) >= 1, f"n_envs must be >= 1, got {self.n_envs}")
        need(1 <= int(self.episode_len) < 2**31, f"episode_len must be >= 1, got {self.episode_len}")
        need(int(self.n_actions) >= 2, f"n_actions must be >= 2, got {self.n_actions}")
        need(self.fill in ("open", "close"), f"fill must be 'open' or 'close', got {self.fill!r}")
        need(np.isfinite(self.cost_bps) and self.cost_bps >= 0, f"cost_bps must be >= 0, got {self.cost_bps}")
        need(
            np.isfinite(self.slippage_bps) and self.slippage_bps >= 0,
            f"slippage_bps must be >= 0, got {self.slippage_bps}",
        )
        need(int(self.hold_cap) >= 1, f"hold_cap must be >= 1, got {self.hold_cap}")
        need(0 <= int(self.seed) < 2**64, f"seed must be in [0, 2**64), got {self.seed}")
        if self.levels is not None:
            lv = np.asarray(self.levels, dtype=np.float64)
            need(lv.shape == (self.n_actions,), f"levels has {lv.size} entries, n_actions is {self.n_actions}")
            need(
                bool(np.all(np.isfinite(lv))) and bool(np.all(np.diff(lv) > 0)),
                f"levels must be finite and increasing, got {self.levels}",
            )
        if self.mirror:
            lv = self.position_levels()
            need(
                np.array_equal(lv[::-1], -lv),
                f"mirror needs antisymmetric levels (levels[A-1-a] == -levels[a]), got {lv.tolist()}",
            )

    def position_levels(self) -> np.ndarray:
        """The target position of each action: float32 ``[n_actions]``."""
        if self.levels is None:
            return ref.position_levels(self.n_actions)
        return np.asarray(self.levels, dtype=np.float32)

    @property
    def rows_per_step(self) -> int:
        """Transition rows per env per step written by ``record``."""
        return ref.rows_per_step(self.n_actions, self.counterfactual, self.mirror)


def _as_f32(name: str, a, ndim: int) -> np.ndarray:
    a = np.asarray(_backend.to_numpy(a))
    if a.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d array, got shape {list(a.shape)}")
    if a.dtype.kind != "f":
        raise ValueError(f"{name}: expected floats, got {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.float32)


def _check_prices(name: str, px: np.ndarray, lo: int, hi: int) -> None:
    bad = np.flatnonzero(~(np.isfinite(px[lo:hi]) & (px[lo:hi] > 0)))
    if bad.size:
        raise ValueError(f"{name}: bar {lo + bad[0]} has price {px[lo + bad[0]]!r}; prices must be finite and positive")


class TradingEnv:
    """``config.n_envs`` environments over one market, stepping together.

    Args:
        open, close: float (cast to float32) ``[T]`` prices.
        features: float (cast to float32) ``[T, F]``, computed causally (row t known at close[t]).
        return_sign: bool ``[F]``, True on columns whose sign follows the market's direction
            (the mirror negates them).
        config: :class:`EnvConfig`.
        t_begin, t_end: the bars the env may use, ``[t_begin, t_end)`` (default: all). Episodes start
            and end inside them; an observation window may reach back before ``t_begin`` (those
            bars are past, known at the decision), never after the bar it observes.
        window: bars of features per observation (``net.window``; >= 1).
        backend: ``"numpy"``, ``"cupy"`` or ``None`` (the process backend).

    Buffers (arrays of the backend, allocated here and never reallocated):
        ``rows`` float32 ``[N, STATE_DIM]`` (the observations by reference), ``obs`` float32
        ``[N, window * (F + 2)]`` (gathered from them: what the network reads), ``reward`` and
        ``done`` float32 ``[N]``, ``actions`` int32 ``[N]``, ``scale`` float32 ``[N]`` (ones),
        ``state`` (:class:`EnvState`), ``seed`` uint64 ``[1]`` (the Philox key ``config.seed``, in device
        memory as the kernels read it: a population's members each their own). :attr:`windows` gathers
        windows of any state rows.
    """

    def __init__(
        self,
        open,
        close,
        features,
        return_sign,
        config: EnvConfig = EnvConfig(),
        *,
        t_begin: int = 0,
        t_end: int | None = None,
        window: int = 1,
        backend: str | None = None,
    ):
        self.config = config
        be = _backend.get(backend)
        self.xp, self.is_gpu = be.xp, be.is_gpu
        self._ops = family("env", self.xp)
        open_, close = _as_f32("open", open, 1), _as_f32("close", close, 1)
        feats = _as_f32("features", features, 2)
        t_n, f_n = feats.shape
        if open_.shape != (t_n,) or close.shape != (t_n,):
            raise ValueError(
                f"open {list(open_.shape)} and close {list(close.shape)} must both be [T] "
                f"with T = {t_n} (features rows)"
            )
        sign_mask = np.asarray(_backend.to_numpy(return_sign))
        if sign_mask.dtype != np.bool_ or sign_mask.shape != (f_n,):
            raise ValueError(f"return_sign: expected bool [{f_n}], got {sign_mask.dtype} {list(sign_mask.shape)}")
        t_end = t_n if t_end is None else int(t_end)
        t_begin = int(t_begin)
        if not (0 <= t_begin < t_end <= t_n):
            raise ValueError(f"need 0 <= t_begin < t_end <= T={t_n}, got t_begin={t_begin}, t_end={t_end}")
        n_starts = t_end - t_begin - config.episode_len - 1
        if n_starts < 1:
            raise ValueError(
                f"the window [{t_begin}, {t_end}) has {t_end - t_begin} bars; "
                f"episode_len={config.episode_len} needs at least {config.episode_len + 2}"
            )
        _check_prices(
            "open" if config.fill == "open" else "close", open_ if config.fill == "open" else close, t_begin, t_end
        )
        bad = np.argwhere(~np.isfinite(feats[t_begin:t_end]))
        if bad.size:
            raise ValueError(f"features: row {t_begin + bad[0][0]}, column {bad[0][1]} is not finite")
        self.t_begin, self.t_end = t_begin, t_end
        self.n_envs, self.n_features, self.n_actions = config.n_envs, f_n, config.n_actions
        self.params = EnvParams(
            t_begin,
            n_starts,
            config.episode_len,
            config.hold_cap,
            config.stagger,
            float(config.cost_bps),
            float(config.slippage_bps),
            int(config.seed),
            config.counterfactual,
            config.mirror,
        )
        xp, n = self.xp, self.n_envs
        ret = ref.bar_returns(open_, close, config.fill)
        self.data = EnvData(
            xp.asarray(feats),
            xp.asarray(ret),
            xp.asarray(config.position_levels()),
            xp.asarray(np.where(sign_mask, np.float32(-1), np.float32(1)).astype(np.float32)),
        )
        lead = (*self._lead, n)  # one env's buffers, or a population's (StackedTradingEnv: [P, N])
        self.state = EnvState(*(xp.zeros(lead, dt) for dt in (np.int32, np.int32, np.int32, F32, np.int32, np.uint64)))
        #: gathers the observation windows from the feature matrix (the env's, the replay's rows too)
        self.windows = Windows(self.data.features, self.data.sign, window, xp)
        self.window, self.obs_dim = self.windows.window, self.windows.width
        self.rows = xp.zeros((*lead, STATE_DIM), F32)
        self.obs = xp.zeros((*lead, self.obs_dim), F32)
        self.reward = xp.zeros(lead, F32)
        self.done = xp.zeros(lead, F32)
        self.actions = xp.zeros(lead, np.int32)
        self.scale = xp.ones(lead, F32)
        self.seed = xp.asarray(self._seeds(config))
        self.reset()

    #: the leading shape of every per-env buffer before ``[N]``: none for one env
    _lead: tuple = ()

    def _seeds(self, config: EnvConfig) -> np.ndarray:
        """The host value of :attr:`seed`: uint64 ``[1]``, ``config.seed``."""
        return np.array([config.seed], np.uint64)

    def share_features(self, other: TradingEnv) -> None:
        """Gather windows from ``other``'s device feature matrix instead of this env's own copy, which is
        dropped (a population's members: the same prepared features, one copy). Before any capture."""
        if other.data.features.shape != self.data.features.shape:
            raise ValueError(
                f"share_features: feature matrices differ in shape ({list(self.data.features.shape)} here, "
                f"{list(other.data.features.shape)} there)"
            )
        self.data = self.data._replace(features=other.data.features)
        self.windows.features = other.data.features

    # --- ops ----------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Start a new episode in every env (draws keyed by each env's step counter); writes ``rows``
        and ``obs``."""
        self._ops.reset(self.state, self.rows, self.params, self.seed)
        self._gather()

    def act(self, q, epsilon, out=None):
        """Epsilon-greedy actions from ``q`` float32 ``[N, A]`` and ``epsilon`` float32 ``[1]``
        (e.g. a ``DeviceScalars`` view); writes ``out`` (default ``self.actions``) and returns it."""
        out = self.actions if out is None else out
        self._ops.act(out, q, epsilon, self.state.count, self.seed)
        return out

    def record(self, out: Transitions, actions=None, scale=None) -> Transitions:
        """Write the coming step's transitions into ``out`` (``rows_per_step * N`` rows); call
        before :meth:`step` with the same ``actions`` and ``scale``."""
        self._ops.record(out, self.state, self._actions(actions), self._scale(scale), self.data, self.params)
        return out

    def step(self, actions=None, scale=None) -> None:
        """Move to the targets of ``actions`` int32 ``[N]`` (default ``self.actions``), sized by
        ``scale`` float32 ``[N]`` in [0, 1] (the plan head's conviction; default ones); writes
        ``state``, ``rows``, ``obs``, ``reward``, ``done``."""
        self._ops.step(
            self.state,
            self.rows,
            self.reward,
            self.done,
            self._actions(actions),
            self._scale(scale),
            self.data,
            self.params,
            self.seed,
        )
        self._gather()

    def record_step(self, out: Transitions, discount, gamma) -> Transitions:
        """:meth:`record` into ``out``, ``discount = gamma[0] * (1 - out.done)`` (float32 ``[M]``;
        ``gamma`` a float32 ``[1]`` device scalar) and :meth:`step`, with ``actions`` and ``scale``,
        in one launch (four on the unfused path, which stays as its oracle: the collect step's env phase)."""
        self._ops.record_step(
            out,
            discount,
            gamma,
            self.state,
            self.rows,
            self.reward,
            self.done,
            self.obs,
            self.actions,
            self.scale,
            self.data,
            self.params,
            self.seed,
            self.window,
        )
        return out

    def _actions(self, actions):
        return self.actions if actions is None else actions

    def _scale(self, scale):
        return self.scale if scale is None else scale

    # --- buffers and state ------------------------------------------------------------------------
    @property
    def rows_per_step(self) -> int:
        return self.config.rows_per_step

    def make_transitions(self) -> Transitions:
        """A :class:`Transitions` buffer sized for one :meth:`record` (allocate before any capture):
        state rows, not windows."""
        return Transitions.allocate(self.xp, self.rows_per_step * self.n_envs)

    def state_dict(self) -> dict:
        """Host copies of the state and the last outputs (for checkpoints; not inside a capture). The
        observations are kept as state rows (``rows``); :meth:`load_state_dict` gathers ``obs`` again."""
        return {k: _backend.to_numpy(v).copy() for k, v in self._state_buffers().items()}

    def _state_buffers(self) -> dict:
        """The buffers :meth:`state_dict` holds, by their keys."""
        return {
            **{f"state.{k}": v for k, v in self.state._asdict().items()},
            "rows": self.rows,
            "actions": self.actions,
            "scale": self.scale,
        }

    def load_state_dict(self, sd: dict) -> None:
        """Restore :meth:`state_dict` into the existing buffers (their addresses stay the same)."""
        self._load_state(self._state_buffers(), sd)

    def _load_state(self, dst: dict, sd: dict) -> None:
        """Copy ``sd`` into the buffers ``dst`` (:meth:`_state_buffers`, or views of them), every entry
        checked first, then gather ``obs`` from the rows."""
        missing = sorted(set(dst) - set(sd))
        if missing:
            raise KeyError(f"env state is missing {missing}")
        src = {k: np.asarray(sd[k]) for k in dst}
        for k, buf in dst.items():
            if src[k].shape != tuple(buf.shape) or src[k].dtype != buf.dtype:
                raise ValueError(
                    f"env state {k}: {src[k].dtype} {list(src[k].shape)} does not fit {buf.dtype} {list(buf.shape)}"
                )
        for k, buf in dst.items():
            buf[...] = self.xp.asarray(src[k])
        self._gather()

    def _gather(self) -> None:
        """``obs`` from ``rows``: the windows of every env's state row (one launch, whatever the leading
        shape: the rows are C-contiguous)."""
        self.windows.gather(self.rows.reshape(-1, STATE_DIM), self.obs.reshape(-1, self.obs_dim))
