"""Q statistics of a C51 head and the adaptive discount controller: twin of ``cuda_src/qstats.cu``.

``stats`` float32 ``[2A + 2]`` = ``mean_Q [A]``, ``entropy``, ``utilisation``, ``var_Q [A]``::

    p[b, a] = softmax(logits[b, a]);  Q[b, a] = sum_k p_k z_k
    mean_Q[a]   = (1/B) sum_b Q[b, a];   var_Q[a] = (1/B) sum_b (Q[b, a] - mean_Q[a])^2
    entropy     = (1/(B A)) sum_{b, a} -sum_k p_k log p_k
    utilisation = (1/K) #{k : (1/(B A)) sum_{b, a} p[b, a, k] > 1/(10 K)}
"""

from __future__ import annotations

import numpy as np

from .c51_chain import log_softmax


def layout(A: int) -> dict:
    """Index of each statistic in the ``[2A + 2]`` output."""
    return {"mean_q": slice(0, A), "entropy": A, "utilisation": A + 1, "var_q": slice(A + 2, 2 * A + 2)}


def per_sample(logits, support, compute_dtype=np.float32):
    """Stage 1: ``(q [B, A], ent [B], mass [B, K])`` (``ent`` and ``mass`` averaged over actions)."""
    x = np.asarray(logits, compute_dtype)
    lp = log_softmax(x)
    p = np.exp(lp)
    q = (p * np.asarray(support, compute_dtype)).sum(-1)
    ent = (-(p * lp).sum(-1)).mean(-1)
    return q.astype(compute_dtype), ent.astype(compute_dtype), p.mean(1).astype(compute_dtype)


def reduce(q, ent, mass, compute_dtype=np.float32):
    """Stage 2: the ``[2A + 2]`` statistics vector from the stage-1 rows."""
    q = np.asarray(q, np.float64)
    B, A = q.shape
    K = mass.shape[1]
    out = np.empty(2 * A + 2, np.float64)
    mean = q.mean(0)
    out[:A] = mean
    out[A] = np.asarray(ent, np.float64).mean()
    out[A + 1] = np.mean(np.asarray(mass, np.float64).mean(0) > 1.0 / (10 * K))
    out[A + 2 :] = ((q - mean) ** 2).mean(0)
    return out.astype(compute_dtype)


def q_stats(logits, support, compute_dtype=np.float32):
    """Both stages: float ``[2A + 2]`` statistics of ``logits [B, A, K]``."""
    return reduce(*per_sample(logits, support, compute_dtype), compute_dtype=compute_dtype)


def adapt_gamma(stats, gamma, util_index, target, rate, gamma_min, gamma_max):
    """``clip(gamma + rate (target - stats[util_index]), gamma_min, gamma_max)`` as float32.

    Utilisation below ``target`` lengthens the horizon (returns spread over more atoms); above
    it shortens it. A proportional controller: its fixed point is utilisation = target unless
    the clip binds.
    """
    g = np.float32(gamma) + np.float32(rate) * (np.float32(target) - np.float32(stats[util_index]))
    return np.float32(min(max(g, np.float32(gamma_min)), np.float32(gamma_max)))
