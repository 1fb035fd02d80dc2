"""NumPy twin of cuda_src/env.cu: N trading environments stepping together.

The semantics live here (the CUDA kernels follow them bit for bit; docs/env.md explains them):

* Time. Bar ``t`` is observed through ``close[t]``. A target position chosen at ``t`` is filled
  at ``fill[t]`` (``open[t+1]``, or ``close[t+1]`` with ``fill="close"``) and held until the
  next fill, so it earns ``ret[t] = fill[t+1] / fill[t] - 1`` (:func:`bar_returns`). A
  transition at ``t`` therefore needs bars up to ``t + 2``.
* Reward (``cudarl.costs``, the model the evaluation uses), in float32::

      r_t = p_t * ret[t] - (cost_bps + slippage_bps) * 1e-4 * |p_t - p_{t-1}|

  with ``p_t = levels[a_t] * scale`` (``scale`` is 1, or the plan head's conviction).
* Observation of env i, by reference: the state row (float32 ``[4]``, :mod:`cudarl.reference.window`)
  ``[t, mirror, p_{t-1}, min(hold, hold_cap) / hold_cap]``: the bar observed, 0 (1 on a mirror row of
  :func:`record`), the position held entering the step, and the hold fraction, where ``hold`` counts
  the steps the position has been held (0 after a reset; after a step ``hold + 1`` if the position
  did not change, else 1). The network's observation is the window of the last ``window`` bars of
  features gathered from it (:func:`cudarl.reference.window.gather`: ``[features[t], p_{t-1}, hold
  fraction]`` with a window of one bar).
* Episodes. ``episode_len`` steps from a start ``s`` drawn uniformly from
  ``[t_begin, t_begin + n_starts)``, ``n_starts = t_end - t_begin - episode_len - 1``. The step
  whose ``steps_left`` reaches 0 reports ``done = 1`` and resets the env on the spot (flat,
  ``hold = 0``, new start). :func:`reset` (all envs) may stagger the first episode's length
  uniformly in ``[1, episode_len]`` so that episode ends spread out.
* Randomness. Philox4x32-10 keyed by ``(seed, count[i], stream_id)`` (``seed``: the ops' uint64
  ``[1]`` argument, the device copy of :attr:`EnvParams.seed`) where ``count[i]`` is env
  i's own device-side step counter (steps taken since construction, incremented by
  :func:`step`), so no two envs or steps share draws and no global counter is raced:

  - :func:`reset` (stream :data:`STREAM_RESET`, counter ``count[i]``): draws ``2i`` (start)
    and ``2i + 1`` (staggered length);
  - an episode end in :func:`step` (stream :data:`STREAM_EPISODE`, counter ``count[i] + 1``,
    the new count): draw ``i`` (start);
  - :func:`act` (stream :data:`STREAM_ACT`, counter ``count[i]``): draws ``2i`` (explore?) and
    ``2i + 1`` (random action).

  An integer below ``n`` is ``(x * n) >> 32`` of a 32-bit draw ``x``.
* Out-of-range actions are clamped into ``[0, n_actions)`` (the kernel cannot raise).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import costs
from . import philox
from ._members import in_place
from .agent import discount as _discount
from .window import STATE_DIM
from .window import gather as _gather

STREAM_RESET = 0x656E7630  # "env0"
STREAM_EPISODE = 0x656E7631  # "env1"
STREAM_ACT = 0x656E7632  # "env2"
F32 = np.float32


class EnvState(NamedTuple):
    """Per-env state, every array ``[N]``; the env's only mutable memory besides its outputs.

    Attributes:
        t: int32, the bar observed now (the newest bar of the observation window).
        start: int32, the first bar of the current episode.
        steps_left: int32, steps left in the episode (>= 1 between steps).
        position: float32, the position held entering the step (``p_{t-1}``).
        hold: int32, steps the position has been held (0 after a reset).
        count: uint64, steps this env has taken since construction (the Philox counter).
    """

    t: object
    start: object
    steps_left: object
    position: object
    hold: object
    count: object


class EnvData(NamedTuple):
    """Read-only market data.

    Attributes:
        features: float32 ``[T, F]``, causal features (row t known at close[t]); the windows are
            gathered from it (:class:`cudarl.window.Windows`), the env kernels never read it.
        ret: float32 ``[T]``, :func:`bar_returns`.
        levels: float32 ``[A]``, the target position of each action.
        sign: float32 ``[F]``, -1 on return-sign columns (negated by the mirror), +1 elsewhere.
    """

    features: object
    ret: object
    levels: object
    sign: object


class EnvParams(NamedTuple):
    """Constants of one env (fixed for its lifetime, so they may be baked into a graph).

    Attributes:
        t_begin: first bar an episode may start at.
        n_starts: number of possible starts (>= 1).
        episode_len: steps per episode (>= 1).
        hold_cap: the hold feature saturates at this many steps (>= 1).
        stagger: whether :func:`reset` staggers the first episode's length.
        cost_bps, slippage_bps: the cost model (``cudarl.costs``).
        seed: the Philox seed (uint64).
        counterfactual: whether :func:`record` writes rows for the other actions.
        mirror: whether :func:`record` writes the directional mirror row.
    """

    t_begin: int
    n_starts: int
    episode_len: int
    hold_cap: int
    stagger: bool
    cost_bps: float
    slippage_bps: float
    seed: int
    counterfactual: bool
    mirror: bool

    @property
    def rate(self) -> np.float32:
        """Cost per unit of position change, float32 (what the kernels receive)."""
        return F32((float(self.cost_bps) + float(self.slippage_bps)) * 1e-4)


class Transitions(NamedTuple):
    """Rows of experience, struct of arrays; ``M = rows_per_step * N`` rows per env step.

    Row ``g * N + i`` is group ``g`` of env i: group 0 the real transition, groups
    ``1 .. A-1`` (with counterfactuals) the action ``(a + g) % A``, the last group (with the
    mirror) the directional mirror.

    Attributes:
        obs: float32 ``[M, STATE_DIM]``, the observation by reference (a state row,
            :mod:`cudarl.reference.window`): what the replay stores.
        action: int32 ``[M]``.
        reward: float32 ``[M]``.
        next_obs: float32 ``[M, STATE_DIM]``, the true next observation (before any reset).
        done: float32 ``[M]``, 1.0 where the episode ended at this step.
    """

    obs: object
    action: object
    reward: object
    next_obs: object
    done: object

    @staticmethod
    def allocate(xp, n_rows: int) -> Transitions:
        return Transitions(
            xp.zeros((n_rows, STATE_DIM), F32),
            xp.zeros(n_rows, np.int32),
            xp.zeros(n_rows, F32),
            xp.zeros((n_rows, STATE_DIM), F32),
            xp.zeros(n_rows, F32),
        )


# --- helpers shared by both backends --------------------------------------------------------------
def bar_returns(open_: np.ndarray, close: np.ndarray, fill: str = "open") -> np.ndarray:
    """``ret[t] = fill[t+1] / fill[t] - 1`` with ``fill[t] = open[t+1]`` (or ``close[t+1]``).

    Args:
        open_, close: float32 ``[T]`` prices.
        fill: ``"open"`` or ``"close"``.
    Returns:
        float32 ``[T]``; the last two entries (no transition can use them) are 0.
    """
    if fill not in ("open", "close"):
        raise ValueError(f"fill must be 'open' or 'close', got {fill!r}")
    px = np.asarray(open_ if fill == "open" else close, dtype=F32)
    ret = np.zeros(px.shape[0], dtype=F32)
    if px.shape[0] >= 3:
        ret[:-2] = px[2:] / px[1:-1] - F32(1)
    return ret


def position_levels(n_actions: int) -> np.ndarray:
    """``A`` evenly spaced positions from -1 to 1, exactly antisymmetric: float32 ``[A]``.

    ``levels[A-1-a] == -levels[a]`` bit for bit, so the mirror of action a is action A-1-a.
    """
    if int(n_actions) < 2:
        raise ValueError(f"n_actions must be at least 2, got {n_actions}")
    a = int(n_actions)
    lv = np.array([-1.0 + 2.0 * k / (a - 1) for k in range(a)], dtype=np.float64).astype(F32)
    lv[a - 1 - np.arange(a // 2)] = -lv[: a // 2]
    if a % 2:
        lv[a // 2] = F32(0)
    return lv


def reward(prev_position, position, ret, params: EnvParams, compute_dtype=F32):
    """The env's reward, exactly ``cudarl.costs.bar_net_return`` in ``compute_dtype``."""
    c = np.dtype(compute_dtype).type
    return costs.bar_net_return(
        np.asarray(prev_position).astype(c),
        np.asarray(position).astype(c),
        np.asarray(ret).astype(c),
        params.cost_bps,
        params.slippage_bps,
    )


def hold_feature(hold: np.ndarray, hold_cap: int) -> np.ndarray:
    """``min(hold, hold_cap) / hold_cap``: float32 ``[N]``."""
    return np.minimum(hold, hold_cap).astype(F32) / F32(hold_cap)


def _philox_per_env(seed: int, counters: np.ndarray, stream_id: int, b: np.ndarray) -> np.ndarray:
    """Block ``b[i]`` of stream ``(seed, counters[i], stream_id)``: uint32 ``[N, 4]``."""
    c = np.asarray(counters, dtype=np.uint64)
    ctr = np.empty(c.shape + (4,), dtype=np.uint32)
    ctr[:, 0] = np.asarray(b, dtype=np.uint32)
    ctr[:, 1] = np.uint32(stream_id)
    ctr[:, 2] = (c & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    ctr[:, 3] = (c >> np.uint64(32)).astype(np.uint32)
    return philox.philox4x32(ctr, philox.key_of(seed))


def _below(x: np.ndarray, n) -> np.ndarray:
    """``(x * n) >> 32``: an integer in ``[0, n)`` from a uint32 draw (int32 ``[N]``)."""
    return ((x.astype(np.uint64) * np.uint64(n)) >> np.uint64(32)).astype(np.int32)


def _lane(blocks: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    return blocks[np.arange(blocks.shape[0]), lanes]


def write_state(
    rows: np.ndarray, t: np.ndarray, position: np.ndarray, hold: np.ndarray, hold_cap: int, mirror: bool = False
) -> None:
    """``rows[i] = [t[i], mirror, position[i], hold_feature(hold[i])]``; rows float32 ``[N, STATE_DIM]``."""
    rows[:, 0] = np.asarray(t).astype(F32)
    rows[:, 1] = F32(1) if mirror else F32(0)
    rows[:, 2] = position
    rows[:, 3] = hold_feature(hold, hold_cap)


# --- the ops ---------------------------------------------------------------------------------------
@in_place(scalars=("seed",), state=1, rows=2)
def reset(state: EnvState, rows: np.ndarray, params: EnvParams, seed: np.ndarray) -> None:
    """Start a new episode in every env and write its observation's state row.

    Writes ``state.t, start, steps_left, position (0), hold (0)`` and ``rows`` float32
    ``[N, STATE_DIM]``; reads ``state.count`` (uint64 ``[N]``) as the Philox counter.
    """
    n = state.t.shape[0]
    i = np.arange(n, dtype=np.int64)
    blk = _philox_per_env(int(seed[0]), state.count, STREAM_RESET, i >> 1)
    lane = 2 * (i & 1)
    s = params.t_begin + _below(_lane(blk, lane), params.n_starts)
    if params.stagger:
        steps = 1 + _below(_lane(blk, lane + 1), params.episode_len)
    else:
        steps = np.full(n, params.episode_len, dtype=np.int32)
    state.t[:] = s
    state.start[:] = s
    state.steps_left[:] = steps
    state.position[:] = F32(0)
    state.hold[:] = 0
    write_state(rows, state.t, state.position, state.hold, params.hold_cap)


def _target(actions: np.ndarray, scale: np.ndarray, levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    a = np.clip(actions, 0, levels.shape[0] - 1).astype(np.int32)
    return a, (levels[a] * scale).astype(F32)


@in_place(scalars=("seed",), state=1, rows=2, reward_out=1, done_out=1, actions=1, scale=1)
def step(
    state: EnvState,
    rows: np.ndarray,
    reward_out: np.ndarray,
    done_out: np.ndarray,
    actions: np.ndarray,
    scale: np.ndarray,
    data: EnvData,
    params: EnvParams,
    seed: np.ndarray,
) -> None:
    """Move every env to its target position, earn the reward, advance one bar, reset ended episodes.

    Args:
        actions: int32 ``[N]`` action indices (clamped into ``[0, A)``).
        scale: float32 ``[N]`` position scale in [0, 1] (ones when conviction sizing is off).
    Writes:
        every field of ``state``; ``rows`` float32 ``[N, STATE_DIM]`` (the next observation's state
        row, after a reset where one happened); ``reward_out`` float32 ``[N]``; ``done_out`` float32 ``[N]``.
    """
    n = state.t.shape[0]
    _, p = _target(actions, scale, data.levels)
    prev = state.position.copy()
    r = reward(prev, p, data.ret[state.t], params)
    hold = np.where(p == prev, state.hold + 1, 1).astype(np.int32)
    t = (state.t + 1).astype(np.int32)
    steps_left = (state.steps_left - 1).astype(np.int32)
    count = state.count + np.uint64(1)
    done = steps_left == 0
    i = np.arange(n, dtype=np.int64)
    blk = _philox_per_env(int(seed[0]), count, STREAM_EPISODE, i >> 2)
    s = (params.t_begin + _below(_lane(blk, i & 3), params.n_starts)).astype(np.int32)
    state.t[:] = np.where(done, s, t)
    state.start[:] = np.where(done, s, state.start)
    state.steps_left[:] = np.where(done, params.episode_len, steps_left)
    state.position[:] = np.where(done, F32(0), p)
    state.hold[:] = np.where(done, 0, hold)
    state.count[:] = count
    reward_out[:] = r
    done_out[:] = done.astype(F32)
    write_state(rows, state.t, state.position, state.hold, params.hold_cap)


def rows_per_step(n_actions: int, counterfactual: bool, mirror: bool) -> int:
    """Row groups :func:`record` writes per env step: the real one, ``A-1`` counterfactual, 1 mirror."""
    return 1 + (int(n_actions) - 1 if counterfactual else 0) + (1 if mirror else 0)


def record(
    out: Transitions, state: EnvState, actions: np.ndarray, scale: np.ndarray, data: EnvData, params: EnvParams
) -> None:
    """Write this step's transitions (real, counterfactual, mirror) before :func:`step` runs.

    Prices do not depend on the agent, so the reward of any other action is exact. The mirror
    negates the return-sign feature columns (its state rows carry ``mirror = 1``, which the window
    gather applies), the positions and the market's return; its reward is computed directly in the
    mirrored market (``(-p) * (-ret) - rate * |-p + p_prev|``), never by negating the real reward.

    Args:
        out: :class:`Transitions` with ``rows_per_step * N`` rows (see its layout).
        state: the state before the step (read only).
        actions, scale: exactly what will be passed to :func:`step`.
    """
    n, a_n = state.t.shape[0], data.levels.shape[0]
    g_n = rows_per_step(a_n, params.counterfactual, params.mirror)
    if out.action.shape[0] != g_n * n:
        raise ValueError(f"out has {out.action.shape[0]} rows; this env writes {g_n} x {n}")
    a_real = np.clip(actions, 0, a_n - 1).astype(np.int32)
    t, prev, hold = state.t, state.position, state.hold
    done = (state.steps_left == 1).astype(F32)
    ret = data.ret[t]
    groups = [(a_real, False)]
    if params.counterfactual:
        groups += [((a_real + g) % a_n, False) for g in range(1, a_n)]
    if params.mirror:
        groups.append((a_n - 1 - a_real, True))
    for g, (a, mirrored) in enumerate(groups):
        rows = slice(g * n, (g + 1) * n)
        p = (data.levels[a] * scale).astype(F32)
        prev_g, ret_g = (-prev, -ret) if mirrored else (prev, ret)
        out.action[rows] = a
        out.reward[rows] = reward(prev_g, p, ret_g, params)
        out.done[rows] = done
        write_state(out.obs[rows], t, prev_g, hold, params.hold_cap, mirrored)
        hold_next = np.where(p == prev_g, hold + 1, 1)
        write_state(out.next_obs[rows], t + 1, p, hold_next, params.hold_cap, mirrored)


@in_place(
    scalars=("gamma", "seed"),
    out=2,
    discount_out=1,
    state=1,
    rows=2,
    reward_out=1,
    done_out=1,
    obs=2,
    actions=1,
    scale=1,
)
def record_step(
    out: Transitions,
    discount_out: np.ndarray,
    gamma: np.ndarray,
    state: EnvState,
    rows: np.ndarray,
    reward_out: np.ndarray,
    done_out: np.ndarray,
    obs: np.ndarray,
    actions: np.ndarray,
    scale: np.ndarray,
    data: EnvData,
    params: EnvParams,
    seed: np.ndarray,
    window: int,
) -> None:
    """The collect step's env work, the composition the fused kernel computes in one launch:
    :func:`record` into ``out``; ``discount_out = gamma[0] * (1 - out.done)`` (float32 ``[M]``,
    :func:`cudarl.reference.agent.discount`; ``gamma`` float32 ``[1]``); :func:`step`; then ``obs``
    float32 ``[N, window * (F + 2)]``, the windows of the new state rows
    (:func:`cudarl.reference.window.gather`). With the member axis (the kernels' ``blockIdx.y``) every
    argument but ``data``, ``params`` and ``window`` gains a leading ``[P]``: member ``i`` is this call
    on its entries."""
    record(out, state, actions, scale, data, params)
    _discount(discount_out, out.done, gamma)
    step(state, rows, reward_out, done_out, actions, scale, data, params, seed)
    _gather(rows, data.features, data.sign, obs, window)


def with_rate(params: EnvParams, rate) -> EnvParams:
    """``params`` whose :attr:`EnvParams.rate` is the float32 ``rate`` (its cost: ``rate / 1e-4`` bps, no
    slippage). The round trip is exact: ``(rate / 1e-4) * 1e-4`` in float64 is within a few float64 ulps
    of ``rate``, which is a float32, so it rounds back to ``rate``; the rewards (:func:`reward`, in float32)
    are then those of any params of that rate."""
    out = params._replace(cost_bps=float(rate) / 1e-4, slippage_bps=0.0)
    if out.rate != F32(rate):
        raise ValueError(f"with_rate: {rate!r} does not round-trip")  # never, by the argument above
    return out


def _member_args(i: int, **arrays) -> dict:
    """Member ``i``'s entries of ``arrays`` (a NamedTuple of arrays field by field; a device scalar as a
    1-element view)."""
    return {
        k: type(v)(*(f[i] for f in v)) if isinstance(v, tuple) else (v[i : i + 1] if v.ndim == 1 else v[i])
        for k, v in arrays.items()
    }


def _member_market(i: int, data: EnvData, params: EnvParams, rates, hold_caps) -> tuple[EnvData, EnvParams]:
    """Member ``i``'s data (its rows of ``data.ret`` and ``data.levels`` where they are ``[P, ...]``) and params
    (``with_rate(params, rates[i])`` with ``hold_cap = hold_caps[i]``)."""
    one = {k: getattr(data, k)[i] for k in ("ret", "levels") if np.ndim(getattr(data, k)) == 2}
    return data._replace(**one), with_rate(params, rates[i])._replace(hold_cap=int(hold_caps[i]))


def step_members(
    state, rows, reward_out, done_out, actions, scale, data: EnvData, params: EnvParams, seed, rates, hold_caps
) -> None:
    """:func:`step` over P members whose costs and reward options differ (``rates`` float32, ``hold_caps``
    int32 ``[P]``, ``data.ret`` ``[T]`` or ``[P, T]``, ``data.levels`` ``[A]`` or ``[P, A]``): member ``i`` is
    :func:`step` on its entries with its data and params (:func:`_member_market`)."""
    for i in range(rates.shape[0]):
        d, p = _member_market(i, data, params, rates, hold_caps)
        a = _member_args(i, state=state, rows=rows, seed=seed, reward_out=reward_out, done_out=done_out,
                         actions=actions, scale=scale)  # fmt: skip
        step(data=d, params=p, **a)


def record_step_members(
    out, discount_out, gamma, state, rows, reward_out, done_out, obs, actions, scale, data: EnvData,
    params: EnvParams, seed, window: int, rates, hold_caps,
) -> None:  # fmt: skip
    """:func:`record_step` over P members whose costs and reward options differ (as :func:`step_members`):
    member ``i`` is :func:`record_step` on its entries with its data and params."""
    for i in range(rates.shape[0]):
        d, p = _member_market(i, data, params, rates, hold_caps)
        a = _member_args(i, out=out, gamma=gamma, state=state, rows=rows, obs=obs, seed=seed,
                         discount_out=discount_out, reward_out=reward_out, done_out=done_out, actions=actions,
                         scale=scale)  # fmt: skip
        record_step(data=d, params=p, window=window, **a)


@in_place(scalars=("epsilon", "seed"), actions=1, q=2, count=1)
def act(actions: np.ndarray, q: np.ndarray, epsilon: np.ndarray, count: np.ndarray, seed: np.ndarray) -> None:
    """Epsilon-greedy actions from Q values.

    Args:
        actions: int32 ``[N]``, written.
        q: float32 ``[N, A]``.
        epsilon: float32 ``[1]`` (device memory on the GPU, so a graph replay sees updates).
        count: uint64 ``[N]``, the envs' step counters (``EnvState.count``).
        seed: uint64 ``[1]``, their Philox key.
    Env i explores when ``uniform(draw 2i) < epsilon`` and then takes ``below(draw 2i+1, A)``;
    otherwise the first index of the largest Q (a strict ``>`` scan from action 0).
    """
    n, a_n = q.shape
    i = np.arange(n, dtype=np.int64)
    blk = _philox_per_env(int(seed[0]), count, STREAM_ACT, i >> 1)
    lane = 2 * (i & 1)
    explore = philox.to_uniform(_lane(blk, lane)) < F32(epsilon[0])
    rand_a = _below(_lane(blk, lane + 1), a_n)
    best, greedy = q[:, 0].copy(), np.zeros(n, dtype=np.int32)
    for a in range(1, a_n):
        better = q[:, a] > best
        best = np.where(better, q[:, a], best)
        greedy = np.where(better, a, greedy)
    actions[:] = np.where(explore, rand_a, greedy).astype(np.int32)
