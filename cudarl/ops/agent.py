"""Launchers for cuda_src/agent.cu (twin: cudarl/reference/agent.py)."""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch


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
    """Linear epsilon schedule from the device counter ``count`` (int64 ``[1]``, incremented)."""
    launch(
        "agent",
        "epsilon",
        1,
        1,
        (eps, count, float(start), float(end), int(steps)),
        stream=stream,
    )


def _check(name: str, a, dtype, shape: tuple) -> None:
    if a.dtype != np.dtype(dtype) or tuple(a.shape) != tuple(shape) or not a.flags.c_contiguous:
        raise ValueError(
            f"{name}: expected a C-contiguous {np.dtype(dtype)} array {list(shape)}, got {a.dtype} {list(a.shape)}"
        )


def _check_act(actions, q, env_count, eps, count, arrivals) -> tuple[int, int]:
    if q.ndim != 2:
        raise ValueError(f"q: expected float32 [n, A], got shape {list(q.shape)}")
    n, a_n = q.shape
    _check("q", q, np.float32, (n, a_n))
    _check("actions", actions, np.int32, (n,))
    _check("env_count", env_count, np.uint64, (n,))
    _check("eps", eps, np.float32, (1,))
    _check("count", count, np.int64, (1,))
    _check("arrivals", arrivals, np.uint32, (1,))
    return n, a_n


def _launch_act(op: str, grid: int, args: tuple, params, eps, count, arrivals, start, end, steps, stream) -> None:
    """Launch the fused act kernel ``op`` with its own ``args`` and the schedule's (ACT_SCHEDULE_PARAMS)."""
    schedule = (eps, count, arrivals, float(start), float(end), int(steps), int(params.seed))
    launch("agent", op, grid, 256, (*args, *schedule), stream=stream)


def act_c51(
    actions,
    q,
    logits,
    support,
    env_count,
    params,
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
    int32 ``[n]`` from the envs' counters ``env_count`` uint64 ``[n]`` and ``params.seed``; one
    launch (a warp per env). ``arrivals`` uint32 ``[1]``: the kernel's ticket counter, 0 between
    launches (allocate it zeroed and leave it to the kernel)."""
    n, a_n = _check_act(actions, q, env_count, eps, count, arrivals)
    k_n = logits.shape[-1] if logits.ndim == 3 else 0
    _check("logits", logits, np.float32, (n, a_n, k_n))
    _check("support", support, np.float32, (k_n,))
    args = (actions, q, logits, support, env_count, n, a_n, k_n)
    _launch_act("act_c51", blocks_for(32 * n), args, params, eps, count, arrivals, start, end, steps, stream)


def act_c51_dueling(
    actions,
    q,
    va,
    support,
    env_count,
    params,
    eps,
    count,
    arrivals,
    start: float,
    end: float,
    steps: int,
    stream=None,
) -> None:
    """:func:`act_c51` from the dueling head's raw output ``va`` float32 ``[n, (1 + A) K]`` (``K`` =
    ``support``'s length): the dueling combine (``nn.dueling_forward``'s bits) inside the same launch."""
    n, a_n = _check_act(actions, q, env_count, eps, count, arrivals)
    k_n = support.shape[0] if support.ndim == 1 else 0
    _check("support", support, np.float32, (k_n,))
    _check("va", va, np.float32, (n, (1 + a_n) * k_n))
    args = (actions, q, va, support, env_count, n, a_n, k_n)
    _launch_act("act_c51_dueling", blocks_for(32 * n), args, params, eps, count, arrivals, start, end, steps, stream)


def act_iqn(
    actions, q, theta, env_count, params, eps, count, arrivals, start: float, end: float, steps: int, stream=None
) -> None:
    """:func:`act_c51` for an IQN head: ``q`` is the mean over quantiles of ``theta`` float32
    ``[n, N, A]`` (the bits of :func:`quantile_mean`). One launch (a thread per env)."""
    n, a_n = _check_act(actions, q, env_count, eps, count, arrivals)
    n_q = theta.shape[1] if theta.ndim == 3 else 0
    _check("theta", theta, np.float32, (n, n_q, a_n))
    args = (actions, q, theta, env_count, n, n_q, a_n)
    _launch_act("act_iqn", blocks_for(n), args, params, eps, count, arrivals, start, end, steps, stream)


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
    params,
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
    n, a_n = _check_act(actions, q, env_count, eps, count, arrivals)
    k_n = logits.shape[-1] if logits.ndim == 3 else 0
    _check("logits", logits, np.float32, (n, a_n, k_n))
    _check("support", support, np.float32, (k_n,))
    args = (actions, q, logits, support, env_count, n, a_n, k_n, int(mode), float(alpha), float(lam))
    _launch_act("act_c51_risk", blocks_for(32 * n), args, params, eps, count, arrivals, start, end, steps, stream)


def act_quantile_risk(
    actions,
    q,
    theta,
    env_count,
    params,
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
    n, a_n = _check_act(actions, q, env_count, eps, count, arrivals)
    n_q = theta.shape[1] if theta.ndim == 3 else 0
    _check("theta", theta, np.float32, (n, n_q, a_n))
    args = (actions, q, theta, env_count, n, n_q, a_n, int(mode), float(alpha), float(lam))
    _launch_act("act_quantile_risk", blocks_for(n), args, params, eps, count, arrivals, start, end, steps, stream)


def publish(ring, loss, grad_norm, step, slots: int, stream=None) -> None:
    """Copy ``loss[0]``, ``grad_norm[0]`` into slot ``step[0] % slots`` of ``ring`` (float32 ``[2 * slots]``)."""
    if ring.size != 2 * slots:
        raise ValueError(f"ring: expected {2 * slots} floats, got {ring.size}")
    launch(
        "agent",
        "publish",
        1,
        1,
        (ring, loss, grad_norm, step, slots),
        stream=stream,
    )


def publish_row(ring, values, step, slots: int, stream=None) -> None:
    """Copy ``values`` (float32 ``[n]``) into slot ``step[0] % slots`` of ``ring`` (float32 ``[slots * n]``)."""
    (n,) = values.shape
    _check("values", values, np.float32, (n,))
    _check("ring", ring, np.float32, (slots * n,))
    _check("step", step, np.int64, (1,))
    launch("agent", "publish_row", 1, 256, (ring, values, n, step, slots), stream=stream)
