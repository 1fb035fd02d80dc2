"""Q statistics of a head: twin of ``cuda_src/qstats.cu``.

``stats`` float32 ``[2A + 2]`` = ``mean_Q [A]``, ``entropy``, ``utilisation``, ``var_Q [A]``::

    p[b, a] = softmax(logits[b, a]);  Q[b, a] = sum_k p_k z_k
    mean_Q[a]   = (1/B) sum_b Q[b, a];   var_Q[a] = (1/B) sum_b (Q[b, a] - mean_Q[a])^2
    entropy     = (1/(B A)) sum_{b, a} -sum_k p_k log p_k
    utilisation = (1/K) #{k : (1/(B A)) sum_{b, a} p[b, a, k] > 1/(10 K)}

A head without atoms (IQN, QR-DQN: ``Q`` the quantile mean) has :func:`moments`: the same mean and
variance, entropy and utilisation NaN. The train step computes them every update over the batch's
``s`` (``cudarl.rules``) and the host reads them one step late (metrics.jsonl, the guard).

The functions marked :func:`members` (and :func:`q_stats`, which calls them) also take a leading axis
of ``P`` members (a population's agents): logits ``[P, B, A, K]`` (the support ``[P, K]`` or ``[K]``,
one for every member), the stage-1 rows ``[P, ...]``; each result gains the axis. Member ``i`` is the
single call on member ``i``'s arguments, as the kernels' ``blockIdx.y`` makes it.
"""

from __future__ import annotations

import numpy as np

from ._members import members
from .c51_chain import log_softmax


def layout(A: int) -> dict:
    """Index of each statistic in the ``[2A + 2]`` output."""
    return {"mean_q": slice(0, A), "entropy": A, "utilisation": A + 1, "var_q": slice(A + 2, 2 * A + 2)}


@members(shared=("support",), logits=3, support=1)
def per_sample(logits, support, compute_dtype=np.float32):
    """Stage 1: ``(q [B, A], ent [B], mass [B, K])`` (``ent`` and ``mass`` averaged over actions)."""
    x = np.asarray(logits, compute_dtype)
    lp = log_softmax(x)
    p = np.exp(lp)
    q = (p * np.asarray(support, compute_dtype)).sum(-1)
    ent = (-(p * lp).sum(-1)).mean(-1)
    return q.astype(compute_dtype), ent.astype(compute_dtype), p.mean(1).astype(compute_dtype)


@members(q=2, ent=1, mass=2)
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


def moments(q, compute_dtype=np.float32):
    """A head without atoms: the ``[2A + 2]`` vector with :func:`reduce`'s mean and variance of
    ``q [B, A]`` and NaN entropy and utilisation."""
    q = np.asarray(q, np.float64)
    A = q.shape[1]
    out = np.full(2 * A + 2, np.nan, np.float64)
    mean = q.mean(0)
    out[:A] = mean
    out[A + 2 :] = ((q - mean) ** 2).mean(0)
    return out.astype(compute_dtype)


def expected_q(logits, support, compute_dtype=np.float32):
    """``Q [B, A] = sum_k softmax(logits[b, a])_k z_k``: :func:`per_sample`'s first output alone."""
    return per_sample(logits, support, compute_dtype)[0]


def q_stats(logits, support, compute_dtype=np.float32):
    """Both stages: float ``[2A + 2]`` statistics of ``logits [B, A, K]``."""
    return reduce(*per_sample(logits, support, compute_dtype), compute_dtype=compute_dtype)
