"""Launchers for ``cuda_src/qstats.cu`` (twin: ``cudarl/reference/qstats.py``).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read.
"""

from __future__ import annotations

import numpy as np

from ..kernels import launch
from ._arrays import check, warp_grid

F32 = np.float32
THREADS = 256  # must equal QS_THREADS in qstats.cu


def per_sample(logits, support, out_q, out_ent, out_mass, stream=None) -> None:
    """Stage 1: writes ``out_q [B, A]``, ``out_ent [B]``, ``out_mass [B, K]``."""
    w = "qstats.per_sample"
    B, A, K = logits.shape
    check(w, "logits", logits, F32, (B, A, K))
    check(w, "support", support, F32, (K,))
    check(w, "out_q", out_q, F32, (B, A))
    check(w, "out_ent", out_ent, F32, (B,))
    check(w, "out_mass", out_mass, F32, (B, K))
    grid, block = warp_grid(B)
    launch(
        "qstats",
        "per_sample",
        grid,
        block,
        (logits, support, out_q, out_ent, out_mass, B, A, K),
        stream=stream,
    )


def reduce(q, ent, mass, out, stream=None) -> None:
    """Stage 2: writes ``out [2A + 2]`` (may be a ``PinnedReadback.device`` view)."""
    w = "qstats.reduce"
    B, A = q.shape
    K = mass.shape[1]
    check(w, "q", q, F32, (B, A))
    check(w, "ent", ent, F32, (B,))
    check(w, "mass", mass, F32, (B, K))
    check(w, "out", out, F32, (2 * A + 2,))
    launch(
        "qstats",
        "reduce",
        1,
        THREADS,
        (q, ent, mass, out, B, A, K),
        stream=stream,
    )


def q_stats(logits, support, scratch_q, scratch_ent, scratch_mass, out, stream=None) -> None:
    """Both stages; the scratch buffers are the caller's (allocated before any capture)."""
    per_sample(logits, support, scratch_q, scratch_ent, scratch_mass, stream=stream)
    reduce(scratch_q, scratch_ent, scratch_mass, out, stream=stream)


def adapt_gamma(
    stats, gamma, util_index: int, target: float, rate: float, gamma_min: float, gamma_max: float, stream=None
) -> None:
    """``gamma[0] <- clip(gamma + rate (target - stats[util_index]), gamma_min, gamma_max)`` on the device."""
    check("qstats.adapt_gamma", "stats", stats, F32, tuple(stats.shape))
    check("qstats.adapt_gamma", "gamma", gamma, F32, (1,))
    if not 0 <= util_index < stats.size:
        raise ValueError(f"qstats.adapt_gamma: util_index {util_index} outside stats of size {stats.size}")
    if not 0 < gamma_min <= gamma_max < 1:
        raise ValueError(f"qstats.adapt_gamma: need 0 < gamma_min <= gamma_max < 1, got {gamma_min}, {gamma_max}")
    launch(
        "qstats",
        "adapt_gamma",
        1,
        32,
        (stats, gamma, int(util_index), float(target), float(rate), float(gamma_min), float(gamma_max)),
        stream=stream,
    )
