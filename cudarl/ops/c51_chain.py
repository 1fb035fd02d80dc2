"""Launchers for ``cuda_src/c51_chain.cu`` (twin: ``cudarl/reference/c51_chain.py``): the unfused C51
targets and loss, the oracle of the fused ``cudarl.ops.c51.targets_loss[_popart]``.

Each launcher checks shapes and dtypes, then launches into the buffers it is given. None
allocates, synchronises or reads device memory, so all are safe inside a graph capture.
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.c51_chain import PRIORITY_KINDS
from ..reference.popart import STATE_SIZE
from ._arrays import check, check_counter, warp_grid
from .popart import REDUCE_THREADS as POPART_THREADS  # a project_popart block: 8 warps, 8 samples

F32, I32 = np.float32, np.int32


def _check_next(w, online, target, support, out_probs, out_a_star, **per_sample):
    """Checks shared by the launchers that compute the next distribution; ``per_sample`` are ``[B]`` floats."""
    B, A, K = online.shape
    check(w, "logits_online_tp1", online, F32, (B, A, K))
    check(w, "logits_target_tp1", target, F32, (B, A, K))
    check(w, "support", support, F32, (K,))
    check(w, "out_probs", out_probs, F32, (B, K))
    check(w, "out_a_star", out_a_star, I32, (B,))
    for name, a in per_sample.items():
        check(w, name, a, F32, (B,))
    if K < 2:
        raise ValueError(f"{w}: need at least 2 atoms, got {K}")
    return B, A, K


def next_probs(logits_online_tp1, logits_target_tp1, support, out_probs, out_a_star, stream=None) -> None:
    """Double-DQN next distribution: writes ``out_probs [B, K]`` and ``out_a_star int32 [B]``."""
    w = "c51_chain.next_probs"
    B, A, K = _check_next(w, logits_online_tp1, logits_target_tp1, support, out_probs, out_a_star)
    grid, block = warp_grid(B)
    launch(
        "c51_chain",
        "next_probs",
        grid,
        block,
        (logits_online_tp1, logits_target_tp1, support, out_probs, out_a_star, B, A, K),
        stream=stream,
    )


def project(probs_tp1, r_t, discount_t, support, out, stream=None) -> None:
    """Categorical projection of ``r_t + discount_t * z``: writes ``out [B, K]``."""
    w = "c51_chain.project"
    B, K = probs_tp1.shape
    check(w, "probs_tp1", probs_tp1, F32, (B, K))
    check(w, "r_t", r_t, F32, (B,))
    check(w, "discount_t", discount_t, F32, (B,))
    check(w, "support", support, F32, (K,))
    check(w, "out", out, F32, (B, K))
    if K < 2:
        raise ValueError(f"{w}: need at least 2 atoms, got {K}")
    grid, block = warp_grid(B)
    launch(
        "c51_chain",
        "project",
        grid,
        block,
        (probs_tp1, r_t, discount_t, support, out, B, K),
        stream=stream,
    )


def targets(
    logits_online_tp1, logits_target_tp1, support, r_t, discount_t, out, out_probs, out_a_star, stream=None
) -> None:
    """The C51 target without PopArt in one launch: :func:`next_probs` then :func:`project` per sample.

    Writes ``out [B, K]``, ``out_probs [B, K]`` and ``out_a_star int32 [B]``.
    """
    w = "c51_chain.targets"
    B, A, K = _check_next(
        w, logits_online_tp1, logits_target_tp1, support, out_probs, out_a_star, r_t=r_t, discount_t=discount_t
    )
    check(w, "out", out, F32, (B, K))
    grid, block = warp_grid(B)
    launch(
        "c51_chain",
        "targets",
        grid,
        block,
        (logits_online_tp1, logits_target_tp1, support, r_t, discount_t, out_probs, out_a_star, out, B, A, K),
        stream=stream,
    )


def next_probs_td(
    logits_online_tp1,
    logits_target_tp1,
    support,
    r_t,
    discount_t,
    state,
    out_probs,
    out_a_star,
    out_y,
    out_state_prev,
    stream=None,
) -> None:
    """PopArt targets, launch 1 of 2: next probabilities, ``a*`` and the return-space TD targets
    ``y = r + d (s sum_k p_k z_k + mu)`` with the statistics in ``state [8]`` (only read), which
    are also copied to ``out_state_prev [8]`` for :func:`project_popart`."""
    w = "c51_chain.next_probs_td"
    B, A, K = _check_next(
        w,
        logits_online_tp1,
        logits_target_tp1,
        support,
        out_probs,
        out_a_star,
        r_t=r_t,
        discount_t=discount_t,
        out_y=out_y,
    )
    check(w, "state", state, F32, (STATE_SIZE,))
    check(w, "out_state_prev", out_state_prev, F32, (STATE_SIZE,))
    if out_state_prev.data.ptr == state.data.ptr:
        raise ValueError(f"{w}: out_state_prev must be a buffer of its own, not the PopArt state")
    grid, block = warp_grid(B)
    launch(
        "c51_chain",
        "next_probs_td",
        grid,
        block,
        (
            logits_online_tp1,
            logits_target_tp1,
            support,
            r_t,
            discount_t,
            state,
            out_probs,
            out_a_star,
            out_y,
            out_state_prev,
            B,
            A,
            K,
        ),
        stream=stream,
    )


def project_popart(
    probs_tp1, r_t, discount_t, support, y, state_prev, beta, state, out_r_norm, out, sigma_min=1e-4, stream=None
) -> None:
    """PopArt targets, launch 2 of 2: ``state`` = the PopArt update of ``state_prev`` with ``y``,
    ``out_r_norm = (r - (1 - d) mu') / s'`` with the updated statistics, and ``out [B, K]`` = the
    projection of ``r~ + d z``. ``beta`` is a float32 ``[1]`` device slot."""
    w = "c51_chain.project_popart"
    B, K = probs_tp1.shape
    check(w, "probs_tp1", probs_tp1, F32, (B, K))
    for name, a in (("r_t", r_t), ("discount_t", discount_t), ("y", y), ("out_r_norm", out_r_norm)):
        check(w, name, a, F32, (B,))
    check(w, "support", support, F32, (K,))
    check(w, "state_prev", state_prev, F32, (STATE_SIZE,))
    check(w, "state", state, F32, (STATE_SIZE,))
    if state_prev.data.ptr == state.data.ptr:
        raise ValueError(f"{w}: state_prev must be a buffer of its own, not the PopArt state")
    check(w, "beta", beta, F32, (1,))
    check(w, "out", out, F32, (B, K))
    if K < 2:
        raise ValueError(f"{w}: need at least 2 atoms, got {K}")
    launch(
        "c51_chain",
        "project_popart",
        blocks_for(B, POPART_THREADS // 32),
        POPART_THREADS,
        (probs_tp1, r_t, discount_t, support, y, state_prev, beta, state, out_r_norm, out, B, K, float(sigma_min)),
        stream=stream,
    )


def loss(
    logits_tm1, a_tm1, target, weights, out_loss_per, out_loss, out_grad, out_priority, done, priority="kl", stream=None
) -> None:
    """Cross-entropy loss, gradient, priorities and the weighted batch mean, in one launch.

    Writes ``out_loss_per [B]``, ``out_loss [1]`` (may be a pinned device view),
    ``out_grad [B, A, K]`` (every element) and ``out_priority [B]``. ``done`` is a uint32 ``[1]``
    ticket counter, 0 before the launch and left 0 (the block that finishes last sums the batch).
    """
    w = "c51_chain.loss"
    if priority not in PRIORITY_KINDS:
        raise ValueError(f"{w}: priority {priority!r} is not one of {PRIORITY_KINDS}")
    B, A, K = logits_tm1.shape
    check(w, "logits_tm1", logits_tm1, F32, (B, A, K))
    check(w, "a_tm1", a_tm1, I32, (B,))
    check(w, "target", target, F32, (B, K))
    check(w, "weights", weights, F32, (B,))
    check(w, "out_loss_per", out_loss_per, F32, (B,))
    check(w, "out_loss", out_loss, F32, (1,))
    check(w, "out_grad", out_grad, F32, (B, A, K))
    check(w, "out_priority", out_priority, F32, (B,))
    check_counter(w, "done", done)
    grid, block = warp_grid(B)
    launch(
        "c51_chain",
        "loss",
        grid,
        block,
        (
            logits_tm1,
            a_tm1,
            target,
            weights,
            out_loss_per,
            out_priority,
            out_grad,
            out_loss,
            done,
            B,
            A,
            K,
            PRIORITY_KINDS.index(priority),
            1.0 / B,
        ),
        stream=stream,
    )
