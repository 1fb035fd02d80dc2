"""The unfused C51 chain in NumPy, the twin of ``cuda_src/c51_chain.cu``: double-DQN next distribution,
PopArt, projection, cross-entropy loss. It is the oracle the fused ``targets_loss`` (``c51.py``) is
checked against, and the CPU backend of ``cudarl.losses.c51_targets`` / ``c51_loss``.

Bellemare, Dabney & Munos (2017), "A Distributional Perspective on Reinforcement Learning";
double-DQN action selection from van Hasselt, Guez & Silver (2016).

Shapes: ``B`` samples, ``A`` actions, ``K`` atoms on a uniform support
``z_k = v_min + k * dz``, ``dz = (v_max - v_min) / (K - 1)``, ``K >= 2``.
Every op returns float32 (int32 for actions) unless ``compute_dtype`` says otherwise;
``compute_dtype=np.float64`` is for finite-difference checks.
"""

from __future__ import annotations

import numpy as np

from . import popart as _popart
from .util import weighted_mean

#: Priority signals of :func:`loss` (the kernel takes the index).
PRIORITY_KINDS = ("ce", "kl")


def softmax(logits, axis=-1):
    """Numerically stable softmax along ``axis`` (max subtracted first)."""
    x = np.asarray(logits)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(logits, axis=-1):
    """``x - max(x) - log(sum(exp(x - max(x))))`` along ``axis``."""
    x = np.asarray(logits)
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def support_params(support):
    """``(v_min, v_max, dz)`` of a uniform support ``[K]``; raises if ``K < 2``."""
    z = np.asarray(support)
    if z.ndim != 1 or z.shape[0] < 2:
        raise ValueError(f"support: need a 1-D array of at least 2 atoms, got shape {z.shape}")
    v_min, v_max = z[0], z[-1]
    return v_min, v_max, (v_max - v_min) / z.dtype.type(z.shape[0] - 1)


def expected_q(logits, support, compute_dtype=np.float32):
    """``Q[b, a] = sum_k softmax(logits[b, a])_k z_k``: float ``[B, A]`` from ``[B, A, K]``."""
    x = np.asarray(logits, dtype=compute_dtype)
    return (softmax(x) * np.asarray(support, dtype=compute_dtype)).sum(-1)


def next_probs(logits_online_tp1, logits_target_tp1, support, compute_dtype=np.float32):
    """Double-DQN next-state distribution.

    ``a*_b = argmax_a sum_k softmax(online[b, a])_k z_k`` (first maximum on ties), and
    ``p_b = softmax(target[b, a*_b])``.

    Args:
        logits_online_tp1: float32 ``[B, A, K]``, the online network at ``s_{t+1}``.
        logits_target_tp1: float32 ``[B, A, K]``, the target network at ``s_{t+1}``.
        support: float32 ``[K]``.
    Returns:
        ``(probs [B, K] compute_dtype, a_star int32 [B])``.
    """
    q = expected_q(logits_online_tp1, support, compute_dtype)
    a_star = np.argmax(q, axis=1).astype(np.int32)
    tgt = np.asarray(logits_target_tp1, dtype=compute_dtype)
    rows = tgt[np.arange(tgt.shape[0]), a_star]
    return softmax(rows).astype(compute_dtype), a_star


def project(probs_tp1, r_t, discount_t, support, compute_dtype=np.float32):
    """Categorical projection of ``r_t + discount_t * z`` onto the support.

    For each sample ``b`` and source atom ``j``::

        Tz_j  = clip(r_t + discount_t * z_j, v_min, v_max)
        g_j   = clip((Tz_j - v_min) / dz, 0, K - 1)     (fractional grid position)
        l_j   = floor(g_j),  f_j = g_j - l_j
        m[l_j]     += p_j * (1 - f_j)
        m[l_j + 1] += p_j * f_j                         (only when l_j < K - 1)

    A sample with a non-finite ``r_t`` or ``discount_t`` gets a NaN row, so the loss and the guard
    see it (clipping alone would turn NaN into ``v_min``).

    When ``Tz_j`` lands exactly on an atom (``f_j = 0``, the ``l == u`` case that loses mass in
    the usual ``floor``/``ceil`` formulation) all of ``p_j`` goes to that atom, so
    ``sum_k m_k = sum_j p_j`` always. ``discount_t`` already holds ``gamma^n`` and is 0 at
    terminal transitions, so a terminal's target is a projection of the point mass at ``r_t``.

    Args:
        probs_tp1: ``[B, K]`` next-state probabilities (rows sum to 1).
        r_t: ``[B]`` (n-step) rewards; discount_t: ``[B]``; support: ``[K]``.
    Returns:
        ``m [B, K]`` in ``compute_dtype``.
    """
    p = np.asarray(probs_tp1, dtype=compute_dtype)
    z = np.asarray(support, dtype=compute_dtype)
    r = np.asarray(r_t, dtype=compute_dtype)[:, None]
    d = np.asarray(discount_t, dtype=compute_dtype)[:, None]
    B, K = p.shape
    if z.shape != (K,) or r.shape[0] != B or d.shape[0] != B:
        raise ValueError(
            f"project: probs {p.shape}, r_t {r.shape[:1]}, discount_t {d.shape[:1]}, support {z.shape} disagree"
        )
    v_min, v_max, dz = support_params(z)
    bad = ~(np.isfinite(r[:, 0]) & np.isfinite(d[:, 0]))  # NaN rows, as the kernel writes them
    if bad.any():
        r, d = np.where(bad[:, None], 0, r), np.where(bad[:, None], 0, d)
    tz = np.clip(r + d * z[None, :], v_min, v_max)
    g = np.clip((tz - v_min) / dz, 0, K - 1)
    lo = np.floor(g)
    frac = g - lo
    lo = lo.astype(np.int64)
    m = np.zeros((B, K), dtype=compute_dtype)
    rows = np.repeat(np.arange(B), K)
    np.add.at(m, (rows, lo.ravel()), (p * (1 - frac)).ravel())
    up = lo + 1
    has_up = up < K  # when lo == K - 1 the fraction is exactly 0
    np.add.at(m, (rows[has_up.ravel()], up[has_up]), (p * frac)[has_up])
    m[bad] = np.nan
    return m


def targets(logits_online_tp1, logits_target_tp1, support, r_t, discount_t, state=None, beta=None, sigma_min=1e-4):
    """The C51 target distribution of a batch (the targets phase of a train step).

    Without PopArt (``state`` is None), the twin of ``cudarl_c51_chain_targets``::

        (p, a*) = next_probs(online, target, z),   m = project(p, r, d, z)

    With PopArt (``state`` float32 ``[8]``, ``beta`` its step size), the twin of
    ``cudarl_c51_chain_next_probs_td`` then ``cudarl_c51_chain_project_popart``::

        v_b  = sum_k p_bk z_k                          normalised next value
        y_b  = r_b + d_b (s v_b + mu)                  return-space TD target, statistics before the step
        state' = popart.update(y, state, beta)         the statistics move with this step's y
        r~_b = (r_b - (1 - d_b) mu') / s'              rewards normalised with the UPDATED statistics
        m    = project(p, r~, d, z)

    (``s = sigma / scale``, see :mod:`cudarl.reference.popart`), the same calls in the same order as
    next_probs, the ``[B, K] x [K, 1]`` product, ``popart.td_targets``, ``popart.update``,
    ``popart.normalize_rewards`` and ``project``.

    Args:
        logits_online_tp1, logits_target_tp1: float32 ``[B, A, K]``. support: float32 ``[K]``.
        r_t, discount_t: float32 ``[B]``. state: float32 ``[8]`` or None. beta: float (or ``[1]``).
    Returns:
        ``(m [B, K], probs [B, K], a_star int32 [B], y [B], r_norm [B], state' [8])`` float32; the
        last three are None without PopArt. ``state`` is not modified.
    """
    if state is None:
        probs, a_star = next_probs(logits_online_tp1, logits_target_tp1, support)
        return project(probs, r_t, discount_t, support), probs, a_star, None, None, None
    probs, a_star, y = next_probs_td(logits_online_tp1, logits_target_tp1, support, r_t, discount_t, state)
    m, r_norm, new_state = project_popart(probs, r_t, discount_t, support, y, state, beta, sigma_min)
    return m, probs, a_star, y, r_norm, new_state


def next_probs_td(logits_online_tp1, logits_target_tp1, support, r_t, discount_t, state):
    """:func:`next_probs` and the return-space TD targets ``y = r + d (s sum_k p_k z_k + mu)`` with
    the statistics of ``state`` (PopArt, :func:`targets`): ``(probs [B, K], a_star [B], y [B])``."""
    probs, a_star = next_probs(logits_online_tp1, logits_target_tp1, support)
    v_hat = (probs @ np.asarray(support, np.float32).reshape(-1, 1))[:, 0]  # float32 [B, K] x [K, 1]
    return probs, a_star, _popart.td_targets(r_t, discount_t, v_hat, state)


def project_popart(probs_tp1, r_t, discount_t, support, y, state, beta, sigma_min=1e-4):
    """The PopArt update of ``state`` with ``y``, then :func:`project` of ``r~ + d z`` with
    ``r~ = (r - (1 - d) mu') / s'`` from the updated statistics (:func:`targets`).

    Returns ``(m [B, K], r_norm [B], state' [8])``; ``state`` is not modified.
    """
    new_state = _popart.update(y, state, np.asarray(beta, np.float32).reshape(-1)[0], sigma_min)
    r_norm = _popart.normalize_rewards(r_t, discount_t, new_state)
    return project(probs_tp1, r_norm, discount_t, support), r_norm, new_state


def loss(logits_tm1, a_tm1, target, weights, priority="kl", compute_dtype=np.float32):
    """Importance-weighted cross-entropy of the chosen action's distribution against ``target``.

    With ``x = logits_tm1[b, a_tm1[b]]``, ``log p = log_softmax(x)`` and ``m = target[b]``::

        L_b      = -sum_k m_k log p_k                              (per-sample cross-entropy)
        loss     = (1 / B) sum_b w_b L_b                          (importance-weighted mean)
        dloss/dlogits[b, a, k] = (w_b / B) (p_k sum_j m_j - m_k)  if a == a_tm1[b], else 0
        priority_b = L_b                        (priority="ce")
                   = max(0, L_b + sum_k m_k log m_k)   (priority="kl": KL(m || p), 0 log 0 = 0)

    Args:
        logits_tm1: float32 ``[B, A, K]`` online logits at ``s_t``.
        a_tm1: int32 ``[B]`` actions taken; target: ``[B, K]`` projected targets;
        weights: ``[B]`` importance weights.
        priority: ``"ce"`` or ``"kl"``.
    Returns:
        ``(loss_per [B], loss scalar, grad [B, A, K], priority [B])`` in ``compute_dtype``.
    """
    if priority not in PRIORITY_KINDS:
        raise ValueError(f"priority: {priority!r} is not one of {PRIORITY_KINDS}")
    x = np.asarray(logits_tm1, dtype=compute_dtype)
    a = np.asarray(a_tm1)
    m = np.asarray(target, dtype=compute_dtype)
    w = np.asarray(weights, dtype=compute_dtype)
    B, A, K = x.shape
    if a.shape != (B,) or m.shape != (B, K) or w.shape != (B,):
        raise ValueError(f"loss: logits {x.shape}, actions {a.shape}, target {m.shape}, weights {w.shape} disagree")
    if np.any((a < 0) | (a >= A)):
        raise ValueError(f"loss: actions must lie in [0, {A})")
    rows = x[np.arange(B), a]
    logp = log_softmax(rows)
    ce = -(m * logp).sum(-1)
    mean = weighted_mean(ce, w, 1.0 / B, compute_dtype)
    grad = np.zeros_like(x)
    p = np.exp(logp)
    grad[np.arange(B), a] = (w / B)[:, None] * (p * m.sum(-1, keepdims=True) - m)
    if priority == "ce":
        prio = ce
    else:
        mlogm = np.where(m > 0, m * np.log(np.where(m > 0, m, 1)), 0)
        prio = np.maximum(ce + mlogm.sum(-1), 0)
    return ce.astype(compute_dtype), mean, grad, prio.astype(compute_dtype)
