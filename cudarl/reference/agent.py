"""NumPy twin of cuda_src/agent.cu: the glue of the collect step."""

from __future__ import annotations

import numpy as np


def quantile_mean(q: np.ndarray, theta: np.ndarray) -> None:
    """``q[b, a] = mean_n theta[b, n, a]`` (float32, summed in order n = 0..N-1); q ``[B, A]``, theta ``[B, N, A]``."""
    s = np.zeros(q.shape, np.float32)
    for n in range(theta.shape[1]):
        s += theta[:, n, :]
    q[...] = s / np.float32(theta.shape[1])


def discount(out: np.ndarray, done: np.ndarray, gamma: np.ndarray) -> None:
    """``out = gamma[0] * (1 - done)`` (float32 ``[n]``)."""
    out[...] = np.float32(gamma[0]) * (np.float32(1) - done)


def epsilon(eps: np.ndarray, count: np.ndarray, start: float, end: float, steps: int) -> None:
    """``eps[0] = start + (end - start) * min(count, steps) / steps``, then ``count += 1``."""
    c = int(count[0])
    eps[0] = np.float32(start + (end - start) * (min(c, steps) / steps))
    count[0] = c + 1


def act_c51(
    actions: np.ndarray,
    q: np.ndarray,
    logits: np.ndarray,
    support: np.ndarray,
    env_count: np.ndarray,
    params,
    eps: np.ndarray,
    count: np.ndarray,
    arrivals: np.ndarray,
    start: float,
    end: float,
    steps: int,
) -> None:
    """A C51 agent's act phase after the forward: expected Q, the epsilon schedule, epsilon-greedy.

    Exactly ``q = qstats.per_sample(logits, support)[0]``; ``epsilon(eps, count, start, end, steps)``;
    ``env.act(actions, q, eps, env_count, params)``, in that order (the kernel fuses the three).
    logits float32 ``[n, A, K]``, support ``[K]``, q float32 ``[n, A]`` and actions int32 ``[n]``
    (written), env_count uint64 ``[n]`` (the envs' step counters), params the env's
    :class:`~cudarl.reference.env.EnvParams`. ``arrivals`` (uint32 ``[1]``) is the kernel's
    ticket counter, untouched here.
    """
    from . import env, qstats

    q[...] = qstats.per_sample(logits, support)[0]
    epsilon(eps, count, start, end, steps)
    env.act(actions, q, eps, env_count, params)


def act_c51_dueling(
    actions: np.ndarray,
    q: np.ndarray,
    va: np.ndarray,
    support: np.ndarray,
    env_count: np.ndarray,
    params,
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
    act_c51(actions, q, logits, support, env_count, params, eps, count, arrivals, start, end, steps)


def act_iqn(
    actions: np.ndarray,
    q: np.ndarray,
    theta: np.ndarray,
    env_count: np.ndarray,
    params,
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
    env.act(actions, q, eps, env_count, params)


def publish(ring: np.ndarray, loss: np.ndarray, grad_norm: np.ndarray, step: np.ndarray, slots: int) -> None:
    """``ring[2s], ring[2s + 1] = loss[0], grad_norm[0]`` with ``s = step[0] % slots``."""
    s = int(step[0]) % slots
    ring[2 * s] = loss[0]
    ring[2 * s + 1] = grad_norm[0]


def publish_row(ring: np.ndarray, values: np.ndarray, step: np.ndarray, slots: int) -> None:
    """``ring[s n : (s + 1) n] = values`` with ``s = step[0] % slots``, ``n = values.size``."""
    n = values.size
    s = int(step[0]) % slots
    ring[s * n : (s + 1) * n] = values
