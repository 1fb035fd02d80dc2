"""NumPy twin of cuda_src/agent.cu: the glue of the collect step.

The twins marked :func:`~cudarl.reference._members.in_place` (the fused act ops, :func:`epsilon`,
:func:`publish`, :func:`publish_row`) also take a leading axis of ``P`` members (a population's agents,
the kernels' ``blockIdx.y``): actions and env_count ``[P, n]``, q ``[P, n, A]``, the head's output
``[P, n, ...]``, the support ``[P, K]`` or ``[K]`` (shared), each device scalar ``[P]``, a ring
``[P, ...]``; member ``i`` is the single call on its entries, by construction. ``seed`` (uint64 ``[1]``)
is the envs' Philox key, the device copy of :attr:`cudarl.reference.env.EnvParams.seed`.
"""

from __future__ import annotations

import numpy as np

from ._members import in_place

_ACT = ("seed", "eps", "count", "arrivals")  # the fused act ops' device scalars


def quantile_mean(q: np.ndarray, theta: np.ndarray) -> None:
    """``q[b, a] = mean_n theta[b, n, a]`` (float32, summed in order n = 0..N-1); q ``[B, A]``, theta ``[B, N, A]``."""
    s = np.zeros(q.shape, np.float32)
    for n in range(theta.shape[1]):
        s += theta[:, n, :]
    q[...] = s / np.float32(theta.shape[1])


def discount(out: np.ndarray, done: np.ndarray, gamma: np.ndarray) -> None:
    """``out = gamma[0] * (1 - done)`` (float32 ``[n]``)."""
    out[...] = np.float32(gamma[0]) * (np.float32(1) - done)


@in_place(scalars=("eps", "count"))
def epsilon(eps: np.ndarray, count: np.ndarray, start: float, end: float, steps: int) -> None:
    """``eps[0] = start + (end - start) * min(count, steps) / steps``, then ``count += 1``."""
    c = int(count[0])
    eps[0] = np.float32(start + (end - start) * (min(c, steps) / steps))
    count[0] = c + 1


@in_place(scalars=_ACT, shared=("support",), actions=1, q=2, logits=3, support=1, env_count=1)
def act_c51(
    actions: np.ndarray,
    q: np.ndarray,
    logits: np.ndarray,
    support: np.ndarray,
    env_count: np.ndarray,
    seed: np.ndarray,
    eps: np.ndarray,
    count: np.ndarray,
    arrivals: np.ndarray,
    start: float,
    end: float,
    steps: int,
) -> None:
    """A C51 agent's act phase after the forward: expected Q, the epsilon schedule, epsilon-greedy.

    Exactly ``q = qstats.per_sample(logits, support)[0]``; ``epsilon(eps, count, start, end, steps)``;
    ``env.act(actions, q, eps, env_count, seed)``, in that order (the kernel fuses the three).
    logits float32 ``[n, A, K]``, support ``[K]``, q float32 ``[n, A]`` and actions int32 ``[n]``
    (written), env_count uint64 ``[n]`` (the envs' step counters), seed uint64 ``[1]`` (their Philox
    key). ``arrivals`` (uint32 ``[1]``) is the kernel's ticket counter, untouched here.
    """
    from . import env, qstats

    q[...] = qstats.per_sample(logits, support)[0]
    epsilon(eps, count, start, end, steps)
    env.act(actions, q, eps, env_count, seed)


@in_place(scalars=_ACT, shared=("support",), actions=1, q=2, va=2, support=1, env_count=1)
def act_c51_dueling(
    actions: np.ndarray,
    q: np.ndarray,
    va: np.ndarray,
    support: np.ndarray,
    env_count: np.ndarray,
    seed: np.ndarray,
    eps: np.ndarray,
    count: np.ndarray,
    arrivals: np.ndarray,
    start: float,
    end: float,
    steps: int,
) -> None:
    """:func:`act_c51` from the dueling C51 head's raw output ``va`` float32 ``[n, (1 + A) K]``: exactly
    ``nn.dueling_forward(va, logits)`` then :func:`act_c51` on those logits (the kernel combines them
    on the fly and keeps no logits)."""
    from . import nn

    n, A = q.shape
    logits = np.empty((n, A, support.shape[0]), np.float32)
    nn.dueling_forward(va, logits)
    act_c51(actions, q, logits, support, env_count, seed, eps, count, arrivals, start, end, steps)


def act_c51_dueling_members(actions, q, va, support, env_count, seed, eps, count, arrivals, start, end, steps) -> None:
    """:func:`act_c51_dueling` over ``P`` members (``actions [P, n]``, the rest as its member axis) whose
    epsilon schedules differ: ``start``, ``end``, ``steps`` ``[P]``, member ``i`` the single call with
    its schedule on its entries."""
    for i in range(actions.shape[0]):
        s = slice(i, i + 1)
        act_c51_dueling(
            actions[i], q[i], va[i], support if support.ndim == 1 else support[i], env_count[i], seed[s], eps[s],
            count[s], arrivals[s], float(start[i]), float(end[i]), int(steps[i]),
        )  # fmt: skip


@in_place(scalars=_ACT, actions=1, q=2, theta=3, env_count=1)
def act_iqn(
    actions: np.ndarray,
    q: np.ndarray,
    theta: np.ndarray,
    env_count: np.ndarray,
    seed: np.ndarray,
    eps: np.ndarray,
    count: np.ndarray,
    arrivals: np.ndarray,
    start: float,
    end: float,
    steps: int,
) -> None:
    """An IQN agent's act phase after the forward: ``quantile_mean(q, theta)`` (theta float32
    ``[n, N, A]``), then ``epsilon`` and ``env.act`` as in :func:`act_c51`."""
    from . import env

    quantile_mean(q, theta)
    epsilon(eps, count, start, end, steps)
    env.act(actions, q, eps, env_count, seed)


# --- risk-sensitive acting (agent.act_by) -------------------------------------------------------------
#: ``mode`` codes of the risk kernels (``cudarl.config.ACT_BY``; 0, the mean, has kernels of its own).
CVAR, MEAN_STD = 1, 2


def c51_risk(q: np.ndarray, logits: np.ndarray, support: np.ndarray, mode: int, alpha: float, lam: float) -> None:
    """A risk measure of each action's categorical return distribution, into ``q`` float32 ``[n, A]``.

    ``p = softmax(logits)`` over ``support`` z (float32 ``[n, A, K]`` and ``[K]``, ascending), then

    * ``mode`` 1, CVaR at ``alpha`` (the mean of the lower ``alpha`` tail; Rockafellar and Uryasev 2000):
      ``(1/alpha) sum_k z_k clip(alpha - F_k, 0, p_k)`` with ``F_k = p_0 + ... + p_{k-1}``, so the atom
      where the tail ends counts with the part of its mass below ``alpha``;
    * ``mode`` 2: ``mu - lam sigma``, ``mu = sum_k p_k z_k``, ``sigma^2 = sum_k p_k (z_k - mu)^2``.

    float32 arithmetic row by row (a row's value does not depend on the others)."""
    x = np.asarray(logits, np.float32)
    z = np.asarray(support, np.float32)
    m = x.max(axis=-1, keepdims=True)
    log_s = np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    p = np.exp(x - m - log_s)
    if mode == CVAR:
        a = np.float32(alpha)
        before = np.zeros_like(p)  # F_k, the mass of the atoms below k
        np.cumsum(p[..., :-1], axis=-1, dtype=np.float32, out=before[..., 1:])
        w = np.minimum(np.maximum(a - before, np.float32(0)), p)
        q[...] = (w * z).sum(axis=-1, dtype=np.float32) / a
    elif mode == MEAN_STD:
        mu = (p * z).sum(axis=-1, dtype=np.float32)
        d = z - mu[..., None]
        q[...] = mu - np.float32(lam) * np.sqrt((p * (d * d)).sum(axis=-1, dtype=np.float32))
    else:
        raise ValueError(f"mode: 1 (cvar) or 2 (mean_std), got {mode!r}")


def quantile_risk(q: np.ndarray, theta: np.ndarray, mode: int, alpha: float, lam: float) -> None:
    """A risk measure of quantiles ``theta`` float32 ``[B, N, A]``, into ``q`` ``[B, A]`` (sums in order
    n = 0..N-1):

    * ``mode`` 1, CVaR at ``alpha`` over QR-DQN's fixed fractions, quantile n standing for
      ``[n/N, (n+1)/N)``: ``sum_n w_n theta_n / (alpha N)``, ``w_n = clip(alpha N - n, 0, 1)`` (the part of
      its fractions below ``alpha``; by their fractions, not sorted: Dabney et al. 2018 act on the
      quantile function as learned);
    * ``mode`` 2: ``mu - lam sigma`` of the N values (``mu`` as :func:`quantile_mean`, ``sigma^2`` their
      mean squared deviation): for IQN a sample estimate from its drawn fractions."""
    N = theta.shape[1]
    if mode == CVAR:
        an = np.float32(alpha) * np.float32(N)
        s = np.zeros(q.shape, np.float32)
        for n in range(N):
            w = np.minimum(np.maximum(an - np.float32(n), np.float32(0)), np.float32(1))
            s += w * theta[:, n, :]
        q[...] = s / an
    elif mode == MEAN_STD:
        mu = np.empty(q.shape, np.float32)
        quantile_mean(mu, theta)
        v = np.zeros(q.shape, np.float32)
        for n in range(N):
            d = theta[:, n, :] - mu
            v += d * d
        q[...] = mu - np.float32(lam) * np.sqrt(v / np.float32(N))
    else:
        raise ValueError(f"mode: 1 (cvar) or 2 (mean_std), got {mode!r}")


def cvar_taus(tau: np.ndarray, alpha: float) -> None:
    """``tau *= alpha`` in place: IQN's acting fractions, uniform in ``[0, 1)``, into ``[0, alpha)`` (the
    CVaR distortion ``beta(tau) = alpha tau`` of Dabney, Ostrovski, Silver and Munos 2018, section 3.1):
    the mean of the quantiles there estimates CVaR_alpha."""
    tau *= np.float32(alpha)


@in_place(scalars=_ACT, shared=("support",), actions=1, q=2, logits=3, support=1, env_count=1)
def act_c51_risk(
    actions, q, logits, support, env_count, seed, mode, alpha, lam, eps, count, arrivals, start, end, steps
):
    """:func:`act_c51` on :func:`c51_risk`'s values: ``c51_risk``, ``epsilon``, ``env.act``, in that order."""
    from . import env

    c51_risk(q, logits, support, mode, alpha, lam)
    epsilon(eps, count, start, end, steps)
    env.act(actions, q, eps, env_count, seed)


@in_place(scalars=_ACT, actions=1, q=2, theta=3, env_count=1)
def act_quantile_risk(actions, q, theta, env_count, seed, mode, alpha, lam, eps, count, arrivals, start, end, steps):
    """:func:`act_iqn` on :func:`quantile_risk`'s values: ``quantile_risk``, ``epsilon``, ``env.act``."""
    from . import env

    quantile_risk(q, theta, mode, alpha, lam)
    epsilon(eps, count, start, end, steps)
    env.act(actions, q, eps, env_count, seed)


@in_place(scalars=("loss", "grad_norm", "step"), ring=1)
def publish(ring: np.ndarray, loss: np.ndarray, grad_norm: np.ndarray, step: np.ndarray, slots: int) -> None:
    """``ring[2s], ring[2s + 1] = loss[0], grad_norm[0]`` with ``s = step[0] % slots``."""
    s = int(step[0]) % slots
    ring[2 * s] = loss[0]
    ring[2 * s + 1] = grad_norm[0]


@in_place(scalars=("step",), ring=1, values=1)
def publish_row(ring: np.ndarray, values: np.ndarray, step: np.ndarray, slots: int) -> None:
    """``ring[s n : (s + 1) n] = values`` with ``s = step[0] % slots``, ``n = values.size``."""
    n = values.size
    s = int(step[0]) % slots
    ring[s * n : (s + 1) * n] = values
