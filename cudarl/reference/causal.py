"""Causal intervention on feature groups that should not matter: twin of ``cuda_src/causal.cu``.

An intervention ``do(X_G = x')`` on a group ``G`` of input columns that carries no information about
future returns must leave Q unchanged (the invariance principle of Peters, Buehlmann & Meinshausen 2016
and Arjovsky et al.'s IRM 2019; here applied as a consistency penalty on interventional inputs, as in
Mitrovic et al. 2021, "Representation learning via invariant causal mechanisms"). Each train step
intervenes on ONE group, ``groups[counter % G]`` (a device counter, so a graph replay rotates through
them), and penalises the change of the expected Q of the online net, the clean side held fixed::

    x'  = intervene(x)                       on the batch's observations [B, window, F + 2]
    d   = Q(x') - stopgrad(Q(x))             [B, A]
    loss = w mean_{b, a} d^2                 (agent.causal_weight)
    sensitivity[G] = mean_{b, a} |d|         (the group's last measurement: metrics)

The interventions (our choice of what "should not matter" means, ``agent.causal_groups``):

- ``calendar``: the calendar columns (``dow_*``, ``hod_*``) of each row are those of the next row of the
  batch (``(b + 1) mod B``): a draw of the date from the batch's own distribution (mode 0, swap);
- ``level``: the price-level columns (``level_*``) likewise (mode 0);
- ``offset``: every feature column of the window (not the position columns) shifted by
  ``agent.causal_offset`` (mode 1): a common-mode bias of the inputs, as a stale normaliser would give.
  Opt-in (not in the default ``causal_groups``): the shift also moves the return columns, which do carry
  information, so penalising it fights the main loss (measured on the CPU, regime, 210 updates: with
  weight 1 the spread of Q across the batch grew 1.5-2x instead of the sensitivity falling). Use it with
  feature sets where a common shift is meaningless.

Gradients: C51, ``Q = sum_k softmax(logits)_k z_k``, ``dloss/dlogits' = (2 w / (B A)) d p (z - Q')``;
quantile heads, ``Q = mean_n theta``, ``dloss/dtheta'[b, n, a] = (2 w / (B A)) d / N``.
"""

from __future__ import annotations

import numpy as np

from .auxgrad import spread
from .c51_chain import softmax

#: Intervention modes (the ``mode`` table's values).
SWAP, OFFSET = 0, 1


def intervene(x, mask, mode, counter, offset: float, window: int, rows: int | None = None):
    """``out [R, window * C]``: the sub-batch's rows of ``x`` with group ``g = counter[0] % G`` intervened on
    (module docstring).

    ``x`` float32 ``[B, window * C]``; ``mask`` int32 ``[G, C]`` (1 on the group's columns of one bar);
    ``mode`` int32 ``[G]``; ``counter`` int64 ``[1]``; ``rows``: R, the sub-batch's rows, row ``r`` of x's
    row ``floor(r B / R)`` (:func:`cudarl.reference.auxgrad.spread`; None: every row); a swap draws the
    next row of the sub-batch."""
    x = np.asarray(x, np.float32)
    if rows is not None:
        x = x[spread(rows, x.shape[0])]
    B = x.shape[0]
    G, C = mask.shape
    g = int(counter[0]) % G
    v = x.reshape(B, window, C)
    on = np.asarray(mask[g], bool)[None, None, :]
    other = v if int(mode[g]) == OFFSET else v[(np.arange(B) + 1) % B]
    new = v + np.float32(offset) if int(mode[g]) == OFFSET else other
    return np.where(on, new, v).reshape(B, window * C).astype(np.float32)


def penalty_c51(logits_c, q, support, weight, compute_dtype=np.float32):
    """``(d [B, A], grad [B, A, K])`` for C51 logits at the intervened inputs and the clean ``q [B, A]``."""
    x = np.asarray(logits_c, compute_dtype)
    B, A, _ = x.shape
    p = softmax(x)
    z = np.asarray(support, compute_dtype)
    qc = (p * z).sum(-1)
    d = qc - np.asarray(q, compute_dtype)
    grad = (compute_dtype(2.0 * weight) / (B * A)) * d[:, :, None] * p * (z - qc[:, :, None])
    return d.astype(compute_dtype), grad.astype(compute_dtype)


def penalty_quantile(theta_c, q, weight, compute_dtype=np.float32):
    """``(d [B, A], grad [B, N, A])`` for quantiles ``theta_c [B, N, A]`` and the clean ``q [B, A]``."""
    th = np.asarray(theta_c, compute_dtype)
    B, N, A = th.shape
    d = th.mean(1) - np.asarray(q, compute_dtype)
    grad = np.broadcast_to((compute_dtype(2.0 * weight) / (B * A)) * d[:, None, :] / N, th.shape)
    return d.astype(compute_dtype), grad.astype(compute_dtype)


def reduce(d, state, counter, weight):
    """The step's loss and the group's sensitivity into ``state [2 + G]`` (``[loss, group, sens_0, ...]``,
    float32, updated in place: the other groups keep their last measurement), then ``counter[0] += 1``."""
    d = np.asarray(d, np.float64).ravel()
    G = state.shape[0] - 2
    g = int(counter[0]) % G
    state[0] = np.float32(float(weight) * np.mean(d * d))
    state[1] = np.float32(g)
    state[2 + g] = np.float32(np.mean(np.abs(d)))
    counter[0] += 1


def loss_c51(logits_c, q, support, weight):
    """The loss alone, float64 (the finite-difference tests' function)."""
    d, _ = penalty_c51(logits_c, q, support, weight, np.float64)
    return float(weight) * float(np.mean(d * d))


def loss_quantile(theta_c, q, weight):
    """The loss alone, float64 (the finite-difference tests' function)."""
    d, _ = penalty_quantile(theta_c, q, weight, np.float64)
    return float(weight) * float(np.mean(d * d))
