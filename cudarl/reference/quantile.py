"""Quantile losses in NumPy, the twin of ``cuda_src/quantile.cu``.

IQN: Dabney, Ostrovski, Silver & Munos (2018), "Implicit Quantile Networks for Distributional
RL" (taus sampled per sample; here by Philox, bit-identical to the kernel). QR-DQN: Dabney,
Rowland, Bellemare & Munos (2018), "Distributional RL with Quantile Regression" (fixed
midpoint taus). Shapes: ``theta [B, N, A]`` (the IQN head's output layout, action fastest),
``target [B, M]`` (``M = N'``), ``taus [B, N]`` or ``[N]``.
"""

from __future__ import annotations

import numpy as np

from . import philox
from .util import weighted_mean

#: Philox stream id of tau sampling (distinct from the replay's streams).
TAU_STREAM_ID = 0x7A55


def sample_taus(seed, counter, stream_id, shape):
    """IQN taus: ``tau.flat[i] = uniform draw i of Philox stream (seed, counter, stream_id)``.

    Returns float32 ``shape`` in ``[0, 1)``.
    """
    n = int(np.prod(shape))
    return philox.uniform(seed, counter, stream_id, n).reshape(shape)


def qr_taus(n):
    """QR-DQN's fixed quantile midpoints ``tau_i = (2 i + 1) / (2 n)``: float32 ``[n]``."""
    return ((2 * np.arange(n) + 1) / (2.0 * n)).astype(np.float32)


def targets(theta_online_tp1, theta_target_tp1, r_t, discount_t, compute_dtype=np.float32):
    """Double-DQN quantile targets.

    ``a*_b = argmax_a mean_j online[b, j, a]`` (first on ties), ``T_bj = r_b + d_b target[b, j, a*_b]``.

    Args:
        theta_online_tp1, theta_target_tp1: ``[B, M, A]``; r_t, discount_t: ``[B]``.
    Returns:
        ``(T [B, M] compute_dtype, a_star int32 [B])``.
    """
    on = np.asarray(theta_online_tp1, dtype=compute_dtype)
    tg = np.asarray(theta_target_tp1, dtype=compute_dtype)
    a_star = np.argmax(on.mean(axis=1), axis=1).astype(np.int32)
    B = on.shape[0]
    r = np.asarray(r_t, dtype=compute_dtype)[:, None]
    d = np.asarray(discount_t, dtype=compute_dtype)[:, None]
    return (r + d * tg[np.arange(B), :, a_star]).astype(compute_dtype), a_star  # tg[...] is [B, M]


def huber_rho(delta, tau, kappa):
    """``rho(delta) = |tau - 1{delta < 0}| H_kappa(delta) / kappa`` and its derivative wrt ``delta``.

    ``H_kappa(delta) = delta^2 / 2`` for ``|delta| <= kappa``, else ``kappa (|delta| - kappa / 2)``;
    ``kappa = 0`` is plain quantile regression ``|tau - 1{delta < 0}| |delta|``.
    """
    wgt = np.where(delta < 0, 1 - tau, tau)
    ad = np.abs(delta)
    if kappa > 0:
        rho = np.where(ad <= kappa, 0.5 * delta * delta / kappa, ad - 0.5 * kappa)
        psi = np.clip(delta, -kappa, kappa) / kappa
    else:
        rho, psi = ad, np.sign(delta)
    return wgt * rho, wgt * psi


def huber_loss(theta_tm1, a_tm1, target, taus, weights, kappa=1.0, compute_dtype=np.float32):
    """Quantile Huber loss over ``N x M`` pairs and its gradient wrt the quantile values.

    With ``theta_i = theta_tm1[b, i, a_tm1[b]]`` and ``delta_ij = target[b, j] - theta_i``::

        L_b  = sum_i (1 / M) sum_j rho_{tau_i}(delta_ij)
        loss = (1 / B) sum_b w_b L_b
        d loss / d theta[b, i, a_tm1[b]] = -(w_b / (B M)) sum_j rho'_{tau_i}(delta_ij);  other actions 0

    Sign check: a target above a quantile (``delta > 0``) pulls it up with weight ``tau``.

    Args:
        theta_tm1: ``[B, N, A]``; a_tm1: int32 ``[B]``; target: ``[B, M]``;
        taus: ``[B, N]`` (IQN) or ``[N]`` (QR-DQN); weights: ``[B]``; kappa >= 0.
    Returns:
        ``(loss_per [B], loss scalar, grad [B, N, A])``; ``loss_per`` is also the priority signal.
    """
    if kappa < 0:
        raise ValueError(f"kappa must be >= 0, got {kappa}")
    th = np.asarray(theta_tm1, dtype=compute_dtype)
    a = np.asarray(a_tm1)
    T = np.asarray(target, dtype=compute_dtype)
    w = np.asarray(weights, dtype=compute_dtype)
    B, N, A = th.shape
    tau = np.broadcast_to(np.asarray(taus, dtype=compute_dtype), (B, N))
    if a.shape != (B,) or T.ndim != 2 or T.shape[0] != B or w.shape != (B,):
        raise ValueError(
            f"huber_loss: theta {th.shape}, actions {a.shape}, target {T.shape}, weights {w.shape} disagree"
        )
    if np.any((a < 0) | (a >= A)):
        raise ValueError(f"huber_loss: actions must lie in [0, {A})")
    M = T.shape[1]
    q = th[np.arange(B), :, a]  # [B, N]: the chosen action's column
    delta = T[:, None, :] - q[:, :, None]  # [B, N, M]
    rho, drho = huber_rho(delta, tau[:, :, None], compute_dtype(kappa))
    per = (rho.sum(-1).sum(-1) / M).astype(compute_dtype)
    mean = weighted_mean(per, w, 1.0 / B, compute_dtype)
    grad = np.zeros_like(th)
    grad[np.arange(B), :, a] = -(w / (B * M))[:, None] * drho.sum(-1)
    return per, mean, grad
