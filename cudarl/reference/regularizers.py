"""Offline-RL regularisers in NumPy: twin of ``cuda_src/regularizers.cu``.

Discrete CQL (Kumar, Zhou, Tucker & Levine 2020, "Conservative Q-Learning for Offline RL")::

    cql_b = logsumexp_a Q(s_b, a) - Q(s_b, a_b),   loss = alpha (1/B) sum_b cql_b
    d loss / d Q(s_b, a) = (alpha / B) (softmax_a Q(s_b, .)_a - 1{a = a_b})

with ``Q = sum_k softmax(logits)_k z_k`` for C51 (chain rule ``dQ_a/dlogit_ak = p_ak (z_k - Q_a)``)
and ``Q_a = mean_i theta[b, i, a]`` for IQN/QR, ``theta [B, N, A]`` as the IQN head outputs it
(``dQ_a / dtheta[b, i, a] = 1/N``).

IQL expectile regression (Kostrikov, Nair & Levine 2021, "Offline RL with Implicit Q-Learning")
of a value estimate ``v(s)`` towards ``q = Q_target(s, a_data)``::

    u = q - v,  w = |tau - 1{u < 0}|,  loss = (1/B) sum_b w_b u_b^2,  d loss / d v_b = -2 w_b u_b / B

Modulation (the definition cudarl implements): priorities are multiplied by ``2 w_b``, so
``tau = 0.5`` leaves them unchanged and ``tau > 0.5`` replays transitions whose action beats the
value estimate (positive advantage) more often, the same asymmetry IQL puts on the value loss.
"""

from __future__ import annotations

import numpy as np

from .c51_chain import softmax


def _lse(q):
    m = q.max(-1, keepdims=True)
    return (m + np.log(np.exp(q - m).sum(-1, keepdims=True)))[..., 0]


def mean(x, scale, compute_dtype=np.float32):
    """``scale * sum_i x_i`` (summed in float64), as a ``compute_dtype`` scalar: the losses' batch reduction."""
    return compute_dtype(float(np.sum(np.asarray(x, np.float64))) * scale)


def cql_c51(logits, a_data, support, alpha, compute_dtype=np.float32):
    """CQL on expected C51 Q: returns ``(cql_per [B], loss scalar, grad [B, A, K])``."""
    x = np.asarray(logits, compute_dtype)
    z = np.asarray(support, compute_dtype)
    a = np.asarray(a_data)
    B, A, K = x.shape
    p = softmax(x)
    q = (p * z).sum(-1)
    lse = _lse(q)
    per = lse - q[np.arange(B), a]
    coef = softmax(q)
    coef[np.arange(B), a] -= 1
    grad = (compute_dtype(alpha) / B) * coef[:, :, None] * p * (z - q[:, :, None])
    return per.astype(compute_dtype), mean(per, alpha / B, compute_dtype), grad.astype(compute_dtype)


def cql_quantile(theta, a_data, alpha, compute_dtype=np.float32):
    """CQL on mean-quantile Q of ``theta [B, N, A]``: returns ``(cql_per [B], loss scalar, grad [B, N, A])``."""
    th = np.asarray(theta, compute_dtype)
    a = np.asarray(a_data)
    B, N, A = th.shape
    q = th.mean(axis=1)  # [B, A]
    per = _lse(q) - q[np.arange(B), a]
    coef = softmax(q)
    coef[np.arange(B), a] -= 1
    grad = np.broadcast_to((compute_dtype(alpha) / B) * coef[:, None, :] / N, th.shape).copy()
    return per.astype(compute_dtype), mean(per, alpha / B, compute_dtype), grad.astype(compute_dtype)


def expectile(q, v, priority, tau, compute_dtype=np.float32):
    """IQL expectile loss of ``v`` and modulated priorities.

    Returns ``(loss_per [B], loss scalar, grad_v [B], priority_out [B])``.
    """
    q = np.asarray(q, compute_dtype)
    v = np.asarray(v, compute_dtype)
    u = q - v
    w = np.where(u < 0, compute_dtype(1) - compute_dtype(tau), compute_dtype(tau))
    per = w * u * u
    B = q.shape[0]
    return (
        per.astype(compute_dtype),
        mean(per, 1.0 / B, compute_dtype),
        (-2 * w * u / B).astype(compute_dtype),
        (np.asarray(priority, compute_dtype) * 2 * w).astype(compute_dtype),
    )
