"""Offline-RL regularisers in NumPy: twin of ``cuda_src/regularizers.cu``.

Discrete CQL (Kumar, Zhou, Tucker & Levine 2020, "Conservative Q-Learning for Offline RL")::

    cql_b = logsumexp_a Q(s_b, a) - Q(s_b, a_b),   loss = alpha (1/B) sum_b cql_b
    d loss / d Q(s_b, a) = (alpha / B) (softmax_a Q(s_b, .)_a - 1{a = a_b})

with ``Q = sum_k softmax(logits)_k z_k`` for C51 (chain rule ``dQ_a/dlogit_ak = p_ak (z_k - Q_a)``)
and ``Q_a = mean_i theta[b, i, a]`` for IQN/QR, ``theta [B, N, A]`` as the IQN head outputs it
(``dQ_a / dtheta[b, i, a] = 1/N``).

The train step adds it to the head's loss with ``agent.cql_alpha`` (offline training,
``cudarl-train train --offline``). (IQL's expectile regression with priority modulation was retired:
docs/results.md, issue 18.)
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
