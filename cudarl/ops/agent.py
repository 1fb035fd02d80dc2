"""Launchers for cuda_src/agent.cu (twin: cudarl/reference/agent.py).

The member axis (a population's agents, docs/perf-notes.md "The agent axis, in stages", stage 5b): the
fused act launchers (:func:`act_c51`, :func:`act_c51_dueling`, :func:`act_iqn`, :func:`act_c51_risk`,
:func:`act_quantile_risk`), :func:`epsilon`, :func:`publish` and :func:`publish_row` also take their
arrays with a leading axis of ``P`` members: actions and env_count ``[P, n]`` (one member stride), q
``[P, n, A]``, the head's output ``[P, n, ...]``, the support ``[P, K]`` or ``[K]`` (one for every
member), each device scalar (seed, eps, count, arrivals, loss, grad_norm, step) ``[P]``, a publish ring
``[P, ...]`` C-contiguous. One launch whose ``blockIdx.y`` is the member gives member ``i`` the bits of
a single launch on its entries; arrays without the axis are the single launch. ``seed`` is the envs'
Philox key, a uint64 device scalar (:attr:`cudarl.env.TradingEnv.seed`, a member's own).
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ._arrays import family_stride, members


def quantile_mean(q, theta, stream=None) -> None:
    """``q [B, A] = mean over n of theta [B, N, A]``."""
    B, N, A = theta.shape
    if q.shape != (B, A):
        raise ValueError(f"q: expected [{B}, {A}], got {list(q.shape)}")
    launch(
        "agent",
        "quantile_mean",
        blocks_for(B * A),
        256,
        (q, theta, B, N, A),
        stream=stream,
    )


def discount(out, done, gamma, stream=None) -> None:
    """``out = gamma[0] * (1 - done)``; gamma a float32 ``[1]`` device scalar."""
    if out.shape != done.shape:
        raise ValueError(f"out {list(out.shape)} and done {list(done.shape)} must match")
    launch(
        "agent",
        "discount",
        min(blocks_for(out.size), 4096),
        256,
        (out, done, gamma, out.size),
        stream=stream,
    )


def epsilon(eps, count, start: float, end: float, steps: int, stream=None) -> None:
    """Linear epsilon schedule from the device counter ``count`` (int64 ``[1]``, incremented) into ``eps``
    (float32 ``[1]``); ``[P]`` each for P members (one launch)."""
    P = eps.shape[0] if eps.ndim == 1 else 0
    _check("eps", eps, np.float32, (P,))
    _check("count", count, np.int64, (P,))
    launch(
        "agent",
        "epsilon",
        (1, P),
        1,
        (eps, count, float(start), float(end), int(steps)),
        stream=stream,
    )


def _check(name: str, a, dtype, shape: tuple) -> None:
    if a.dtype != np.dtype(dtype) or tuple(a.shape) != tuple(shape) or not a.flags.c_contiguous:
        raise ValueError(
            f"{name}: expected a C-contiguous {np.dtype(dtype)} array {list(shape)}, got {a.dtype} {list(a.shape)}"
        )


class _Act:
    """A fused act launch's member axis: ``P``, each array's member-0 entry (``e``), the strides of the
    per-env vectors (``sn``), q (``sq``), the head's output (``sl``) and the support (``sz``, 0: shared)."""

    def __init__(self, w: str, actions, q, head, head_rank: int, env_count, seed, eps, count, arrivals, support=None):
        arrays = {"actions": (actions, 1), "env_count": (env_count, 1), "q": (q, 2), "head": (head, head_rank)}
        if support is not None:
            arrays["support"] = (support, 1)
        P, e, st = members(w, arrays, shared=("support",))
        axis = len(actions.shape) == 2
        q = e["q"]
        if q.ndim != 2:
            raise ValueError(f"q: expected float32 [n, A], got shape {list(q.shape)}")
        n, a_n = q.shape
        _check("q", q, np.float32, (n, a_n))
        _check("actions", e["actions"], np.int32, (n,))
        _check("env_count", e["env_count"], np.uint64, (n,))
        for name, a, dt in (("seed", seed, np.uint64), ("eps", eps, np.float32), ("count", count, np.int64)):
            _check(name, a, dt, (P if axis else 1,))
        _check("arrivals", arrivals, np.uint32, (P if axis else 1,))
        self.P, self.e, self.n, self.a_n = P, e, n, a_n
        self.sn = family_stride(w, P, e, st, ("actions", "env_count"))
        self.sq = family_stride(w, P, e, st, ("q",))
        self.sl = family_stride(w, P, e, st, ("head",))
        shared = support is None or len(support.shape) == 1
        self.sz = 0 if shared else family_stride(w, P, e, st, ("support",))  # 0: one support for every member
        self.seed, self.eps, self.count, self.arrivals = seed, eps, count, arrivals

    def run(self, op: str, grid: int, args: tuple, start, end, steps, stream) -> None:
        """Launch ``op`` over every member with its own ``args`` and the schedule's (ACT_SCHEDULE_PARAMS)."""
        schedule = (self.eps, self.count, self.arrivals, float(start), float(end), int(steps), self.seed)
        strides = (self.sn, self.sq, self.sl)
        launch("agent", op, (grid, self.P), 256, (*args, *schedule, *strides), stream=stream)


def act_c51(
    actions,
    q,
    logits,
    support,
    env_count,
    seed,
    eps,
    count,
    arrivals,
    start: float,
    end: float,
    steps: int,
    stream=None,
) -> None:
    """Expected Q of ``logits`` float32 ``[n, A, K]`` into ``q`` ``[n, A]``, the epsilon schedule
    (``eps`` float32 ``[1]``, ``count`` int64 ``[1]``, incremented) and epsilon-greedy ``actions``
    int32 ``[n]`` from the envs' counters ``env_count`` uint64 ``[n]`` and their Philox key ``seed``
    (uint64 ``[1]``, device memory); one launch (a warp per env). ``arrivals`` uint32 ``[1]``: the
    kernel's ticket counter, 0 between launches (allocate it zeroed and leave it to the kernel).
    Members: the module's docstring."""
    m = _Act("agent.act_c51", actions, q, logits, 3, env_count, seed, eps, count, arrivals, support)
    n, a_n, e = m.n, m.a_n, m.e
    k_n = e["head"].shape[-1] if e["head"].ndim == 3 else 0
    _check("logits", e["head"], np.float32, (n, a_n, k_n))
    _check("support", e["support"], np.float32, (k_n,))
    args = (e["actions"], e["q"], e["head"], e["support"], e["env_count"], n, a_n, k_n, m.sz)
    m.run("act_c51", blocks_for(32 * n), args, start, end, steps, stream)


def act_c51_dueling(
    actions,
    q,
    va,
    support,
    env_count,
    seed,
    eps,
    count,
    arrivals,
    start: float,
    end: float,
    steps: int,
    stream=None,
) -> None:
    """:func:`act_c51` from the dueling head's raw output ``va`` float32 ``[n, (1 + A) K]`` (``K`` =
    ``support``'s length): the dueling combine (``nn.dueling_forward``'s bits) inside the same launch.
    Members: ``va [P, n, (1 + A) K]``, the rest as the module's docstring."""
    m = _Act("agent.act_c51_dueling", actions, q, va, 2, env_count, seed, eps, count, arrivals, support)
    n, a_n, e = m.n, m.a_n, m.e
    k_n = e["support"].shape[0] if e["support"].ndim == 1 else 0
    _check("support", e["support"], np.float32, (k_n,))
    _check("va", e["head"], np.float32, (n, (1 + a_n) * k_n))
    args = (e["actions"], e["q"], e["head"], e["support"], e["env_count"], n, a_n, k_n, m.sz)
    m.run("act_c51_dueling", blocks_for(32 * n), args, start, end, steps, stream)


def act_c51_dueling_members(
    actions, q, va, support, env_count, seed, eps, count, arrivals, start, end, steps, stream=None
) -> None:
    """:func:`act_c51_dueling` over ``P`` members (the member axis only) whose epsilon schedules differ:
    ``start``, ``end`` float64 and ``steps`` int64 ``[P]`` (member ``i``'s at ``i``), each member the bits
    of :func:`act_c51_dueling` with its schedule."""
    if len(actions.shape) != 2:
        raise ValueError(f"agent.act_c51_dueling_members: actions [P, n], got {list(actions.shape)}")
    P = actions.shape[0]
    for name, a, dt in (("start", start, np.float64), ("end", end, np.float64), ("steps", steps, np.int64)):
        _check(name, a, dt, (P,))
    m = _Act("agent.act_c51_dueling_members", actions, q, va, 2, env_count, seed, eps, count, arrivals, support)
    n, a_n, e = m.n, m.a_n, m.e
    k_n = e["support"].shape[0] if e["support"].ndim == 1 else 0
    _check("support", e["support"], np.float32, (k_n,))
    _check("va", e["head"], np.float32, (n, (1 + a_n) * k_n))
    args = (e["actions"], e["q"], e["head"], e["support"], e["env_count"], n, a_n, k_n, m.sz)
    schedule = (m.eps, m.count, m.arrivals, start, end, steps, m.seed, m.sn, m.sq, m.sl)
    launch("agent", "act_c51_dueling_members", (blocks_for(32 * n), P), 256, (*args, *schedule), stream=stream)


def act_iqn(
    actions, q, theta, env_count, seed, eps, count, arrivals, start: float, end: float, steps: int, stream=None
) -> None:
    """:func:`act_c51` for an IQN head: ``q`` is the mean over quantiles of ``theta`` float32
    ``[n, N, A]`` (the bits of :func:`quantile_mean`). One launch (a thread per env)."""
    m = _Act("agent.act_iqn", actions, q, theta, 3, env_count, seed, eps, count, arrivals)
    n, a_n, e = m.n, m.a_n, m.e
    n_q = e["head"].shape[1] if e["head"].ndim == 3 else 0
    _check("theta", e["head"], np.float32, (n, n_q, a_n))
    args = (e["actions"], e["q"], e["head"], e["env_count"], n, n_q, a_n)
    m.run("act_iqn", blocks_for(n), args, start, end, steps, stream)


def _check_risk(mode: int, alpha: float, lam: float) -> None:
    if mode not in (1, 2):
        raise ValueError(f"mode: 1 (cvar) or 2 (mean_std), got {mode!r} (the mean has kernels of its own)")
    if not (0 < alpha <= 1) or not lam >= 0:
        raise ValueError(f"alpha must be in (0, 1] and lam >= 0, got {alpha!r}, {lam!r}")


def c51_risk(q, logits, support, mode: int, alpha: float, lam: float, stream=None) -> None:
    """The risk measure ``mode`` (1: CVaR at ``alpha``, 2: mean minus ``lam`` std; ``cudarl.config.ACT_BY``)
    of each action's categorical distribution, ``logits`` float32 ``[n, A, K]`` over ``support`` ``[K]``
    (ascending), into ``q`` ``[n, A]``. A warp per row."""
    _check_risk(mode, alpha, lam)
    n, a_n, k_n = logits.shape if logits.ndim == 3 else (0, 0, 0)
    _check("logits", logits, np.float32, (n, a_n, k_n))
    _check("support", support, np.float32, (k_n,))
    _check("q", q, np.float32, (n, a_n))
    launch(
        "agent",
        "c51_risk",
        blocks_for(32 * n),
        256,
        (q, logits, support, n, a_n, k_n, int(mode), float(alpha), float(lam)),
        stream=stream,
    )


def quantile_risk(q, theta, mode: int, alpha: float, lam: float, stream=None) -> None:
    """The risk measure ``mode`` (:func:`c51_risk`) of quantiles ``theta`` float32 ``[B, N, A]`` at QR-DQN's
    fixed fractions (CVaR), or of any quantile sample (mean - lam std), into ``q`` ``[B, A]``."""
    _check_risk(mode, alpha, lam)
    B, N, A = theta.shape if theta.ndim == 3 else (0, 0, 0)
    _check("theta", theta, np.float32, (B, N, A))
    _check("q", q, np.float32, (B, A))
    launch(
        "agent",
        "quantile_risk",
        blocks_for(B * A),
        256,
        (q, theta, B, N, A, int(mode), float(alpha), float(lam)),
        stream=stream,
    )


def cvar_taus(tau, alpha: float, stream=None) -> None:
    """``tau *= alpha`` in place (float32, C-contiguous): IQN's acting fractions into ``[0, alpha)``."""
    if tau.dtype != np.float32 or not tau.flags.c_contiguous:
        raise ValueError(f"tau: expected a C-contiguous float32 array, got {tau.dtype}")
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    launch("agent", "cvar_taus", min(blocks_for(tau.size), 4096), 256, (tau, float(alpha), tau.size), stream=stream)


def act_c51_risk(
    actions,
    q,
    logits,
    support,
    env_count,
    seed,
    mode: int,
    alpha: float,
    lam: float,
    eps,
    count,
    arrivals,
    start: float,
    end: float,
    steps: int,
    stream=None,
) -> None:
    """:func:`act_c51` acting on :func:`c51_risk`'s values (the same bits) instead of the expected Q."""
    _check_risk(mode, alpha, lam)
    m = _Act("agent.act_c51_risk", actions, q, logits, 3, env_count, seed, eps, count, arrivals, support)
    n, a_n, e = m.n, m.a_n, m.e
    k_n = e["head"].shape[-1] if e["head"].ndim == 3 else 0
    _check("logits", e["head"], np.float32, (n, a_n, k_n))
    _check("support", e["support"], np.float32, (k_n,))
    args = (e["actions"], e["q"], e["head"], e["support"], e["env_count"], n, a_n, k_n)
    args = (*args, int(mode), float(alpha), float(lam), m.sz)
    m.run("act_c51_risk", blocks_for(32 * n), args, start, end, steps, stream)


def act_quantile_risk(
    actions,
    q,
    theta,
    env_count,
    seed,
    mode: int,
    alpha: float,
    lam: float,
    eps,
    count,
    arrivals,
    start: float,
    end: float,
    steps: int,
    stream=None,
) -> None:
    """:func:`act_iqn` acting on :func:`quantile_risk`'s values (the same bits) instead of the mean."""
    _check_risk(mode, alpha, lam)
    m = _Act("agent.act_quantile_risk", actions, q, theta, 3, env_count, seed, eps, count, arrivals)
    n, a_n, e = m.n, m.a_n, m.e
    n_q = e["head"].shape[1] if e["head"].ndim == 3 else 0
    _check("theta", e["head"], np.float32, (n, n_q, a_n))
    args = (e["actions"], e["q"], e["head"], e["env_count"], n, n_q, a_n, int(mode), float(alpha), float(lam))
    m.run("act_quantile_risk", blocks_for(n), args, start, end, steps, stream)


def publish(ring, loss, grad_norm, step, slots: int, stream=None) -> None:
    """Copy ``loss[0]``, ``grad_norm[0]`` into slot ``step[0] % slots`` of ``ring`` (float32 ``[2 * slots]``).
    Members: ``ring [P, 2 * slots]`` C-contiguous, ``loss``, ``grad_norm``, ``step`` ``[P]`` (one launch)."""
    P = ring.shape[0] if ring.ndim == 2 else 1
    if ring.ndim == 2:
        _check("ring", ring, np.float32, (P, 2 * slots))
        for name, a, dt in (("loss", loss, np.float32), ("grad_norm", grad_norm, np.float32), ("step", step, np.int64)):
            _check(name, a, dt, (P,))
    elif ring.size != 2 * slots:
        raise ValueError(f"ring: expected {2 * slots} floats, got {ring.size}")
    launch(
        "agent",
        "publish",
        (1, P),
        1,
        (ring, loss, grad_norm, step, slots),
        stream=stream,
    )


def publish_row(ring, values, step, slots: int, stream=None) -> None:
    """Copy ``values`` (float32 ``[n]``) into slot ``step[0] % slots`` of ``ring`` (float32 ``[slots * n]``).
    Members: ``values [P, n]`` (members any whole number of elements apart), ``ring [P, slots * n]``
    C-contiguous, ``step [P]`` (one launch)."""
    w = "agent.publish_row"
    P, e, st = members(w, {"values": (values, 1), "ring": (ring, 1)})
    axis = len(values.shape) == 2
    (n,) = e["values"].shape
    _check("values", e["values"], np.float32, (n,))
    _check("ring", ring, np.float32, (P, slots * n) if axis else (slots * n,))
    _check("step", step, np.int64, (P if axis else 1,))
    sv = family_stride(w, P, e, st, ("values",))
    launch("agent", "publish_row", (1, P), 256, (e["ring"], e["values"], n, step, slots, sv), stream=stream)
