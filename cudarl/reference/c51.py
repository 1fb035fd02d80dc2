"""C51 (categorical DQN) in NumPy, the twin of ``cuda_src/c51.cu``: the train step's targets and loss
from the dueling head's raw output (:func:`targets_loss`, written as the chain of
:mod:`cudarl.reference.c51_chain` it fuses) and the n-step return.

Bellemare, Dabney & Munos (2017), "A Distributional Perspective on Reinforcement Learning";
double-DQN action selection from van Hasselt, Guez & Silver (2016).

The functions marked :func:`members` also take a leading axis of ``P`` members (a population's agents):
every array argument ``[P, ...]`` (the support may stay ``[K]``, one for every member) and each device
scalar (``beta``, ``gamma``) ``[P]``; each result gains the axis. Member ``i`` is the single call on
member ``i``'s arguments, as the kernels' ``blockIdx.y`` makes it.
"""

from __future__ import annotations

import numpy as np

from ._members import members
from .c51_chain import loss, targets
from .util import weighted_mean

#: Warps (samples at a time) of a targets_loss block (C51_TL_WARPS in cuda_src/c51.cu).
TL_WARPS = 4


def targets_loss_blocks(B: int) -> int:
    """The blocks a member's ``targets_loss[_popart]`` launch covers ``B`` samples with (a warp a sample,
    :data:`TL_WARPS` a block): the whole grid without the grid barrier; with it, at most the member's
    share of the resident grid (:func:`cudarl.kernels.barrier_grid_fits`). The launcher's
    (``cudarl.ops.c51``) is this one; the twin has no grid."""
    return max(1, -(-int(B) // TL_WARPS))


def _combine(va, K):
    """The dueling combine of raw head rows ``va [B, (1 + A) K]`` into logits ``[B, A, K]``."""
    from .nn import dueling_forward

    va = np.asarray(va, np.float32)
    B, A = va.shape[0], va.shape[1] // K - 1
    logits = np.empty((B, A, K), np.float32)
    dueling_forward(va, logits)
    return logits


_TL_RANKS = dict(va_tm1=2, va_online_tp1=2, va_target_tp1=2, a_tm1=1, weights=1, support=1, r_t=1, discount_t=1)


@members(shared=("support",), **_TL_RANKS)
def targets_loss(va_tm1, va_online_tp1, va_target_tp1, a_tm1, weights, support, r_t, discount_t, priority="kl"):
    """The C51 target without PopArt and the loss from the dueling head's raw outputs (twin of
    ``cudarl_c51_targets_loss``): with ``logits = dueling_forward(va)`` (:mod:`cudarl.reference.nn`)::

        (m, probs, a*) = targets(logits_online_tp1, logits_target_tp1, z, r, d)
        (loss_per, loss, dlogits, priority) = loss(logits_tm1, a, m, w)
        dva = dueling_backward(dlogits)

    Args:
        va_*: float32 ``[B, (1 + A) K]`` (V, then Adv ``[A, K]``), the online net at s_t and s_{t+1}
            and the target net at s_{t+1}. Others as :func:`targets` and :func:`loss`.
    Returns:
        ``(m, probs, a_star, loss_per, loss, priority, dva)``; an action outside ``[0, A)`` gives
        NaN loss and priority and a zero dva row, as the kernel (where :func:`loss` raises).
    """
    out = _targets_loss(va_tm1, va_online_tp1, va_target_tp1, a_tm1, weights, support, r_t, discount_t, priority)
    m, probs, a_star = out["targets"][:3]
    return m, probs, a_star, out["loss_per"], out["loss"], out["priority"], out["dva"]


def targets_loss_popart_one_launch(P: int, B: int, grid_barrier: bool | str = True, limit: int | None = None) -> bool:
    """The form ``cudarl.ops.c51.targets_loss_popart`` takes (True: one launch with a grid barrier; False: two,
    the same bits): ``grid_barrier`` and :func:`cudarl.kernels.barrier_grid_fits` of :func:`targets_loss_blocks`
    ``(B)`` over ``limit`` resident blocks; ``limit`` not given, the twin has no residency: ``grid_barrier``;
    ``"always"``: True."""
    from ..kernels import barrier_grid_fits

    if grid_barrier == "always" or not grid_barrier:
        return bool(grid_barrier)
    return limit is None or barrier_grid_fits(P, targets_loss_blocks(B), limit)


@members(shared=("support",), **_TL_RANKS, state=1, beta=0)
def targets_loss_popart(
    va_tm1,
    va_online_tp1,
    va_target_tp1,
    a_tm1,
    weights,
    support,
    r_t,
    discount_t,
    state,
    beta,
    sigma_min=1e-4,
    priority="kl",
):
    """:func:`targets_loss` with PopArt (twin of ``cudarl_c51_targets_loss_popart``): the targets as
    :func:`targets` with ``state`` and ``beta``. Returns ``(m, probs, a_star, y, r_norm, state',
    loss_per, loss, priority, dva)``; ``state`` is not modified."""
    out = _targets_loss(
        va_tm1, va_online_tp1, va_target_tp1, a_tm1, weights, support, r_t, discount_t, priority, state, beta, sigma_min
    )
    return (*out["targets"], out["loss_per"], out["loss"], out["priority"], out["dva"])


def _targets_loss(
    va_tm1,
    va_online_tp1,
    va_target_tp1,
    a_tm1,
    weights,
    support,
    r_t,
    discount_t,
    priority,
    state=None,
    beta=None,
    sigma_min=1e-4,
) -> dict:
    from .nn import dueling_backward

    K = np.asarray(support).shape[0]
    logits = _combine(va_tm1, K)
    B, A, _ = logits.shape
    tg = targets(
        _combine(va_online_tp1, K), _combine(va_target_tp1, K), support, r_t, discount_t, state, beta, sigma_min
    )
    a = np.asarray(a_tm1)
    bad = (a < 0) | (a >= A)
    loss_per, mean, dlogits, prio = loss(logits, np.where(bad, 0, a), tg[0], weights, priority=priority)
    if bad.any():  # the kernel's answer to an action it cannot index
        loss_per, prio, dlogits = loss_per.copy(), prio.copy(), dlogits.copy()
        loss_per[bad], prio[bad], dlogits[bad] = np.nan, np.nan, 0
        mean = weighted_mean(loss_per, np.asarray(weights, np.float32), 1.0 / B, np.float32)
    dva = np.empty((B, (1 + A) * K), np.float32)
    dueling_backward(dlogits, dva)
    return {"targets": tg, "loss_per": loss_per, "loss": mean, "priority": prio, "dva": dva}


@members(rewards=2, terminal=2, gamma=0)
def n_step(rewards, terminal, gamma, compute_dtype=np.float32):
    """n-step reward and bootstrap discount.

    ``R_b = sum_{i<n} gamma^i r_{b,i} prod_{j<i} (1 - term_{b,j})`` and
    ``d_b = gamma^n prod_{j<n} (1 - term_{b,j})``: rewards after a terminal are ignored and a
    terminal anywhere in the window zeroes the bootstrap. (Time-limit truncation is not a
    terminal: pass 0 there.)

    Args:
        rewards: ``[B, n]``; terminal: ``[B, n]`` with 1.0 at a terminal step, else 0.0;
        gamma: the one-step discount (a device scalar on the GPU).
    Returns:
        ``(r_t [B], discount_t [B])`` in ``compute_dtype``.
    """
    r = np.asarray(rewards, dtype=compute_dtype)
    term = np.asarray(terminal, dtype=compute_dtype)
    if r.ndim != 2 or term.shape != r.shape:
        raise ValueError(f"n_step: rewards {r.shape} and terminal {term.shape} must both be [B, n]")
    gm = compute_dtype(gamma)
    ret = np.zeros(r.shape[0], dtype=compute_dtype)
    g = np.ones(r.shape[0], dtype=compute_dtype)
    alive = np.ones(r.shape[0], dtype=compute_dtype)
    for i in range(r.shape[1]):
        ret = ret + g * alive * r[:, i]
        alive = alive * (1 - term[:, i])
        g = g * gm
    return ret, (g * alive).astype(compute_dtype)
