"""Launchers for cuda_src/env.cu (twin and semantics: cudarl/reference/env.py).

Same op names and signatures as the reference; each checks shapes and dtypes, then launches.
They write only into the buffers they are given and never allocate, synchronise or read device
values, so they are capture-safe. ``params`` holds constants baked into the launch (fixed for
an env's lifetime); everything that changes between replays (the state, the step counters,
epsilon, the conviction scale, the Philox key ``seed``) is read from device memory.

The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 5b):
:func:`reset`, :func:`step`, :func:`record_step` and :func:`act` also take P members' envs in one
launch: every field of the state and the per-env vectors (reward, done, actions, scale) ``[P, N]``
(one member stride), the state rows ``[P, N, STATE_DIM]``, the windows ``[P, N, width]``, the
transitions' fields ``[P, M, ...]`` and the discounts ``[P, M]``, q ``[P, N, A]``, the device scalars
(seed, gamma, epsilon) ``[P]``; the market data (``data``) and ``params`` are one for every member.
Member ``i`` gets the bits of a single launch on its entries; arrays without the axis are the single
launch. :func:`record` (the unfused oracle) has no member axis.
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.env import EnvData, EnvParams, EnvState, Transitions, rows_per_step
from ..reference.window import STATE_DIM, width
from ._arrays import family_stride, members

_THREADS = 256


def _check(name: str, a, dtype, shape: tuple) -> None:
    if a.dtype != np.dtype(dtype) or tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name}: expected {np.dtype(dtype)} {list(shape)}, got {a.dtype} {list(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: must be C-contiguous")


class _Members:
    """The member axis of an env launch: ``P``, each array's member-0 entry by name (``e``; the state's
    fields as ``state.<field>``), whether the arrays have the axis, and :meth:`stride` of a row family."""

    VECTORS = ("reward", "done", "actions", "scale", *(f"state.{k}" for k in EnvState._fields))

    def __init__(self, w: str, state: EnvState, ranks: dict):
        arrays = {f"state.{k}": (getattr(state, k), 1) for k in EnvState._fields}
        arrays.update(ranks)
        self.w = w
        self.P, self.e, self.st = members(w, arrays)
        self.axis = len(state.t.shape) == 2
        self.state = EnvState(*(self.e[f"state.{k}"] for k in EnvState._fields))

    def stride(self, *names: str) -> int:
        """The one member stride (elements) of the row family ``names``."""
        return family_stride(self.w, self.P, self.e, self.st, names)

    def scalars(self, **arrays) -> None:
        """Device scalars: ``[1]`` for one member, ``[P]`` with the axis."""
        for name, (a, dt) in arrays.items():
            _check(name, a, dt, (self.P if self.axis else 1,))


def _check_state(state: EnvState) -> int:
    n = state.t.shape[0]
    for name, dt in (
        ("t", np.int32),
        ("start", np.int32),
        ("steps_left", np.int32),
        ("position", np.float32),
        ("hold", np.int32),
        ("count", np.uint64),
    ):
        _check(f"state.{name}", getattr(state, name), dt, (n,))
    return n


def _check_data(data: EnvData) -> tuple[int, int, int]:
    if data.features.ndim != 2:
        raise ValueError(f"data.features: expected float32 [T, F], got shape {list(data.features.shape)}")
    t_n, f_n = data.features.shape
    a_n = data.levels.shape[0]
    _check("data.features", data.features, np.float32, (t_n, f_n))
    _check("data.ret", data.ret, np.float32, (t_n,))
    _check("data.levels", data.levels, np.float32, (a_n,))
    _check("data.sign", data.sign, np.float32, (f_n,))
    return t_n, f_n, a_n


def _check_params(params: EnvParams, t_n: int) -> None:
    if not (0 <= params.t_begin and params.n_starts >= 1 and params.episode_len >= 1 and params.hold_cap >= 1):
        raise ValueError(f"params out of range: {params}")
    if params.t_begin + params.n_starts + params.episode_len + 1 > t_n:
        raise ValueError(
            f"params need {params.t_begin + params.n_starts + params.episode_len + 1} bars, data has {t_n}"
        )


def _check_record(
    out: Transitions, state: EnvState, actions, scale, data: EnvData, params: EnvParams
) -> tuple[int, int, int, int, int]:
    """The checks :func:`record` and :func:`record_step` share: the state, data and params, this step's
    transitions ``out`` (``rows_per_step * N`` rows) and ``actions``/``scale``. Returns ``N``, the
    transition rows ``M``, the feature matrix's ``T`` and ``F``, and the action count ``A``."""
    n = _check_state(state)
    t_n, f_n, a_n = _check_data(data)
    _check_params(params, t_n)
    m = rows_per_step(a_n, params.counterfactual, params.mirror) * n
    for name, a, dt, shape in (
        ("out.obs", out.obs, np.float32, (m, STATE_DIM)),
        ("out.action", out.action, np.int32, (m,)),
        ("out.reward", out.reward, np.float32, (m,)),
        ("out.next_obs", out.next_obs, np.float32, (m, STATE_DIM)),
        ("out.done", out.done, np.float32, (m,)),
        ("actions", actions, np.int32, (n,)),
        ("scale", scale, np.float32, (n,)),
    ):
        _check(name, a, dt, shape)
    return n, m, t_n, f_n, a_n


def reset(state: EnvState, rows, params: EnvParams, seed, stream=None) -> None:
    """Start a new episode in every env; writes ``state`` (not ``count``) and the state rows ``rows``
    float32 ``[N, STATE_DIM]``. ``seed``: the Philox key, uint64 ``[1]`` (device memory). Members: the
    module's docstring."""
    m = _Members("env.reset", state, {"rows": (rows, 2)})
    state, rows = m.state, m.e["rows"]
    n = _check_state(state)
    _check("rows", rows, np.float32, (n, STATE_DIM))
    m.scalars(seed=(seed, np.uint64))
    if not (0 <= params.t_begin and params.n_starts >= 1 and params.episode_len >= 1 and params.hold_cap >= 1):
        raise ValueError(f"params out of range: {params}")
    launch(
        "env",
        "reset",
        (blocks_for(n, _THREADS), m.P),
        _THREADS,
        (
            *state[:5],
            state.count,
            rows,
            n,
            params.t_begin,
            params.n_starts,
            params.episode_len,
            params.hold_cap,
            int(bool(params.stagger)),
            seed,
            m.stride(*(f"state.{k}" for k in EnvState._fields)),
            m.stride("rows"),
        ),
        stream=stream,
    )


def step(
    state: EnvState, rows, reward_out, done_out, actions, scale, data: EnvData, params: EnvParams, seed, stream=None
) -> None:
    """Advance every env one bar (see the reference); writes ``state``, ``rows``, ``reward_out``, ``done_out``.

    Args:
        actions: int32 ``[N]``; scale: float32 ``[N]``; rows: float32 ``[N, STATE_DIM]``;
        reward_out, done_out: float32 ``[N]``; seed: uint64 ``[1]``, the Philox key (device memory).
        Members: the module's docstring.
    """
    _step("step", None, state, rows, reward_out, done_out, actions, scale, data, params, seed, stream)


def step_members(
    state: EnvState, rows, reward_out, done_out, actions, scale, data: EnvData, params: EnvParams, seed, rates,
    hold_caps, stream=None,
) -> None:  # fmt: skip
    """:func:`step` over P members (the member axis only) whose costs and reward options differ: ``rates``
    float32 and ``hold_caps`` int32 ``[P]`` (member ``i``'s :attr:`EnvParams.rate` and ``hold_cap``;
    ``params``' are not read), ``data.ret`` ``[T]`` or ``[P, T]`` (a member's fill) and ``data.levels``
    ``[A]`` or ``[P, A]``; member ``i`` the bits of :func:`step` with its values."""
    _step("step_members", (hold_caps, rates), state, rows, reward_out, done_out, actions, scale, data, params, seed,
          stream)  # fmt: skip


def _members_data(m: _Members, data: EnvData, consts) -> tuple:
    """The ``_members`` ops' constants: the member axis (``m``), ``consts`` = ``(hold_caps, rates)`` int32 and
    float32 ``[P]`` (the kernels' order), ``data.ret`` and ``data.levels`` one array or C-contiguous
    ``[P, ...]`` rows. Returns ``(data, (s_ret, s_lv))``: ``data`` with member 0's rows (for the single op's
    checks) and the rows' member strides (0: one array for every member)."""
    if not m.axis:
        raise ValueError(f"{m.w}: the arrays must have the member axis (rates and hold_caps are [P])")
    hold_caps, rates = consts
    _check("hold_caps", hold_caps, np.int32, (m.P,))
    _check("rates", rates, np.float32, (m.P,))
    one, strides = {}, []
    for name in ("ret", "levels"):
        a = getattr(data, name)
        if a.ndim == 2:
            _check(f"data.{name}", a, np.float32, (m.P, a.shape[1]))
            one[name], stride = a[0], a.shape[1]
        else:
            one[name], stride = a, 0
        strides.append(stride)
    return data._replace(**one), tuple(strides)


def _step(op: str, consts, state, rows, reward_out, done_out, actions, scale, data, params, seed, stream) -> None:
    """:func:`step` (``consts`` None: ``params``') or :func:`step_members` (``consts``: its rates and hold caps)."""
    vec = {"reward": (reward_out, 1), "done": (done_out, 1), "actions": (actions, 1), "scale": (scale, 1)}
    m = _Members(f"env.{op}", state, {**vec, "rows": (rows, 2)})
    state, rows, reward_out, done_out, actions, scale = (
        m.state,
        *(m.e[k] for k in ("rows", "reward", "done", "actions", "scale")),
    )
    m.scalars(seed=(seed, np.uint64))
    rows_data, extra = (data, ()) if consts is None else _members_data(m, data, consts)
    n = _check_state(state)
    t_n, f_n, a_n = _check_data(rows_data)
    _check_params(params, t_n)
    _check("rows", rows, np.float32, (n, STATE_DIM))
    _check("reward_out", reward_out, np.float32, (n,))
    _check("done_out", done_out, np.float32, (n,))
    _check("actions", actions, np.int32, (n,))
    _check("scale", scale, np.float32, (n,))
    launch(
        "env",
        op,
        (blocks_for(n, _THREADS), m.P),
        _THREADS,
        (
            *state[:5],
            state.count,
            rows,
            reward_out,
            done_out,
            actions,
            scale,
            data.ret,
            data.levels,
            n,
            a_n,
            params.t_begin,
            params.n_starts,
            params.episode_len,
            *((params.hold_cap, params.rate) if consts is None else consts),
            seed,
            m.stride(*_Members.VECTORS),
            m.stride("rows"),
            *extra,
        ),
        stream=stream,
    )


def record(out: Transitions, state: EnvState, actions, scale, data: EnvData, params: EnvParams, stream=None) -> None:
    """Write this step's transitions into ``out`` (layout: :class:`~cudarl.reference.env.Transitions`).

    Call before :func:`step`, with the same ``actions`` (int32 ``[N]``) and ``scale`` (float32 ``[N]``).
    """
    n, m, _, _, a_n = _check_record(out, state, actions, scale, data, params)
    launch(
        "env",
        "record",
        blocks_for(m, _THREADS),
        _THREADS,
        (
            out.obs,
            out.action,
            out.reward,
            out.next_obs,
            out.done,
            state.t,
            state.steps_left,
            state.position,
            state.hold,
            actions,
            scale,
            data.ret,
            data.levels,
            n,
            a_n,
            params.hold_cap,
            params.rate,
            int(bool(params.counterfactual)),
            int(bool(params.mirror)),
        ),
        stream=stream,
    )


def record_step(
    out: Transitions,
    discount_out,
    gamma,
    state: EnvState,
    rows,
    reward_out,
    done_out,
    obs,
    actions,
    scale,
    data: EnvData,
    params: EnvParams,
    seed,
    window: int,
    stream=None,
) -> None:
    """:func:`record`, the discount of its rows, :func:`step` and the window gather of the new
    observations in one launch (the twin's composition, bit for bit).

    Args:
        out: the transitions (``rows_per_step * N`` rows); discount_out: float32 ``[M]``;
        gamma: float32 ``[1]`` (device memory); rows: float32 ``[N, STATE_DIM]``;
        reward_out, done_out: float32 ``[N]``; obs: float32 ``[N, window * (F + 2)]``;
        actions: int32 ``[N]``; scale: float32 ``[N]``; seed: uint64 ``[1]``, the Philox key (device
        memory). Members: the module's docstring.
    """
    _record_step("record_step", None, out, discount_out, gamma, state, rows, reward_out, done_out, obs, actions,
                 scale, data, params, seed, window, stream)  # fmt: skip


def record_step_members(
    out: Transitions, discount_out, gamma, state: EnvState, rows, reward_out, done_out, obs, actions, scale,
    data: EnvData, params: EnvParams, seed, window: int, rates, hold_caps, stream=None,
) -> None:  # fmt: skip
    """:func:`record_step` over P members (the member axis only) whose costs and reward options differ:
    ``rates``, ``hold_caps``, ``data.ret`` and ``data.levels`` as :func:`step_members`'s; member ``i`` the
    bits of :func:`record_step` with its values."""
    _record_step("record_step_members", (hold_caps, rates), out, discount_out, gamma, state, rows, reward_out,
                 done_out, obs, actions, scale, data, params, seed, window, stream)  # fmt: skip


def _record_step(op, consts, out, discount_out, gamma, state, rows, reward_out, done_out, obs, actions, scale, data,
                 params, seed, window, stream) -> None:  # fmt: skip
    """:func:`record_step` (``consts`` None: ``params``') or :func:`record_step_members` (``consts``: its rates
    and hold caps)."""
    if int(window) < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    w = f"env.{op}"
    vec = {"reward": (reward_out, 1), "done": (done_out, 1), "actions": (actions, 1), "scale": (scale, 1)}
    trans = {f"out.{k}": (getattr(out, k), 2 if k in ("obs", "next_obs") else 1) for k in Transitions._fields}
    mb = _Members(w, state, {**vec, "rows": (rows, 2), "obs": (obs, 2), "discount": (discount_out, 1), **trans})
    e = mb.e
    out = Transitions(*(e[f"out.{k}"] for k in Transitions._fields))
    state, rows, reward_out, done_out, obs, actions, scale, discount_out = (
        mb.state,
        *(e[k] for k in ("rows", "reward", "done", "obs", "actions", "scale", "discount")),
    )
    mb.scalars(gamma=(gamma, np.float32), seed=(seed, np.uint64))
    rows_data, extra = (data, ()) if consts is None else _members_data(mb, data, consts)
    n, m, t_n, f_n, a_n = _check_record(out, state, actions, scale, rows_data, params)
    for name, a, dt, shape in (
        ("discount_out", discount_out, np.float32, (m,)),
        ("rows", rows, np.float32, (n, STATE_DIM)),
        ("reward_out", reward_out, np.float32, (n,)),
        ("done_out", done_out, np.float32, (n,)),
        ("obs", obs, np.float32, (n, width(f_n, int(window)))),
    ):
        _check(name, a, dt, shape)
    launch(
        "env",
        op,
        (blocks_for(32 * n, _THREADS), mb.P),  # a warp per env
        _THREADS,
        (
            *out,
            discount_out,
            gamma,
            *state[:5],
            state.count,
            rows,
            reward_out,
            done_out,
            obs,
            actions,
            scale,
            data.ret,
            data.levels,
            data.features,
            data.sign,
            n,
            a_n,
            params.t_begin,
            params.n_starts,
            params.episode_len,
            *((params.hold_cap, params.rate) if consts is None else consts),
            seed,
            int(bool(params.counterfactual)),
            int(bool(params.mirror)),
            int(window),
            f_n,
            t_n,
            mb.stride(*_Members.VECTORS),
            mb.stride("rows"),
            mb.stride("obs"),
            mb.stride("out.action", "out.reward", "out.done", "discount"),
            mb.stride("out.obs", "out.next_obs"),
            *extra,
        ),
        stream=stream,
    )


def act(actions, q, epsilon, count, seed, stream=None) -> None:
    """Epsilon-greedy ``actions`` int32 ``[N]`` from ``q`` float32 ``[N, A]``, ``epsilon`` float32 ``[1]``
    (device memory), the envs' counters ``count`` uint64 ``[N]`` and their Philox key ``seed`` uint64
    ``[1]`` (device memory). Members: ``actions``, ``count`` ``[P, N]`` (one stride), ``q [P, N, A]``,
    ``epsilon``, ``seed`` ``[P]``."""
    w = "env.act"
    P, e, st = members(w, {"actions": (actions, 1), "count": (count, 1), "q": (q, 2)})
    axis = len(actions.shape) == 2
    actions, count, q = e["actions"], e["count"], e["q"]
    if q.ndim != 2:
        raise ValueError(f"q: expected float32 [N, A], got shape {list(q.shape)}")
    n, a_n = q.shape
    _check("q", q, np.float32, (n, a_n))
    _check("actions", actions, np.int32, (n,))
    _check("epsilon", epsilon, np.float32, (P if axis else 1,))
    _check("seed", seed, np.uint64, (P if axis else 1,))
    _check("count", count, np.uint64, (n,))
    sn, sq = family_stride(w, P, e, st, ("actions", "count")), family_stride(w, P, e, st, ("q",))
    launch(
        "env",
        "act",
        (blocks_for(n, _THREADS), P),
        _THREADS,
        (actions, q, epsilon, count, n, a_n, seed, sn, sq),
        stream=stream,
    )
