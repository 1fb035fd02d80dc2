"""Launchers for ``cuda_src/quantile.cu`` (twin: ``cudarl/reference/quantile.py``).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read.
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ._arrays import check, check_counter, warp_grid

F32, I32 = np.float32, np.int32


def sample_taus(seed: int, counter, stream_id: int, out, stream=None) -> None:
    """Fill ``out`` (float32, any shape) with Philox uniforms; ``counter`` is a uint64 ``[1]`` device slot."""
    check("quantile.sample_taus", "counter", counter, np.uint64, (1,))
    check("quantile.sample_taus", "out", out, F32, tuple(out.shape))
    n = int(out.size)
    launch(
        "quantile",
        "sample_taus",
        blocks_for((n + 3) // 4),
        256,
        (int(seed) & 0xFFFFFFFFFFFFFFFF, counter, int(stream_id), out, n),
        stream=stream,
    )


def targets(theta_online_tp1, theta_target_tp1, r_t, discount_t, out, out_a_star, stream=None) -> None:
    """Double-DQN quantile targets from ``theta_*_tp1 [B, M, A]``: writes ``out [B, M]`` and
    ``out_a_star int32 [B]``."""
    w = "quantile.targets"
    B, M, A = theta_online_tp1.shape
    check(w, "theta_online_tp1", theta_online_tp1, F32, (B, M, A))
    check(w, "theta_target_tp1", theta_target_tp1, F32, (B, M, A))
    check(w, "r_t", r_t, F32, (B,))
    check(w, "discount_t", discount_t, F32, (B,))
    check(w, "out", out, F32, (B, M))
    check(w, "out_a_star", out_a_star, I32, (B,))
    grid, block = warp_grid(B)
    launch(
        "quantile",
        "targets",
        grid,
        block,
        (theta_online_tp1, theta_target_tp1, r_t, discount_t, out, out_a_star, B, A, M),
        stream=stream,
    )


def huber_loss(
    theta_tm1, a_tm1, target, taus, weights, out_loss_per, out_loss, out_grad, done, kappa=1.0, stream=None
) -> None:
    """Quantile Huber loss of ``theta_tm1 [B, N, A]`` and its weighted batch mean in one launch: writes
    ``out_loss_per [B]``, ``out_loss [1]``, ``out_grad [B, N, A]``. ``taus`` is ``[B, N]`` (IQN) or ``[N]``
    (QR-DQN, shared by every sample). ``done`` is a uint32 ``[1]`` ticket counter, 0 before the
    launch and left 0 (the block that finishes last sums the batch).
    """
    w = "quantile.huber_loss"
    B, N, A = theta_tm1.shape
    check(w, "theta_tm1", theta_tm1, F32, (B, N, A))
    check(w, "a_tm1", a_tm1, I32, (B,))
    M = target.shape[1] if len(target.shape) == 2 else -1
    check(w, "target", target, F32, (B, M))
    if tuple(taus.shape) == (N,):
        tau_stride = 0
    else:
        check(w, "taus", taus, F32, (B, N))
        tau_stride = N
    check(w, "taus", taus, F32, tuple(taus.shape))
    check(w, "weights", weights, F32, (B,))
    check(w, "out_loss_per", out_loss_per, F32, (B,))
    check(w, "out_loss", out_loss, F32, (1,))
    check(w, "out_grad", out_grad, F32, (B, N, A))
    check_counter(w, "done", done)
    if not kappa >= 0:
        raise ValueError(f"{w}: kappa must be >= 0, got {kappa}")
    grid, block = warp_grid(B)
    launch(
        "quantile",
        "huber_loss",
        grid,
        block,
        (
            theta_tm1,
            a_tm1,
            target,
            taus,
            weights,
            out_loss_per,
            out_grad,
            out_loss,
            done,
            B,
            A,
            N,
            M,
            tau_stride,
            float(kappa),
            1.0 / B,
        ),
        stream=stream,
    )
