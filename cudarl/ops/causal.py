"""Launchers for ``cuda_src/causal.cu`` (twin: ``cudarl/reference/causal.py``, the equations).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read.
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ._arrays import check, warp_grid

F32, I32, I64 = np.float32, np.int32, np.int64
THREADS = 256  # must equal CI_THREADS


def intervene(x, out, mask, mode, counter, offset: float, window: int, stream=None) -> None:
    """``out [R, window * C]`` = the sub-batch's rows of ``x [Bx, window * C]`` (row ``r`` from row
    ``floor(r Bx / R)``, :func:`cudarl.reference.auxgrad.spread`; ``R == Bx``: every row) with group
    ``counter[0] % G`` intervened on (``mask [G, C]``)."""
    Bx, width = x.shape
    R = out.shape[0]
    G, C = mask.shape
    if width != window * C:
        raise ValueError(f"causal.intervene: width {width} != window {window} * columns {C}")
    if not 1 <= R <= Bx:
        raise ValueError(f"causal.intervene: out has {R} rows, x {Bx}: a sub-batch of 1 to {Bx} rows")
    check("causal.intervene", "x", x, F32, (Bx, width))
    check("causal.intervene", "out", out, F32, (R, width))
    check("causal.intervene", "mask", mask, I32, (G, C))
    check("causal.intervene", "mode", mode, I32, (G,))
    check("causal.intervene", "counter", counter, I64, (1,))
    launch(
        "causal",
        "intervene",
        min(blocks_for(R * width), 4096),
        256,
        (x, out, mask, mode, counter, R, Bx, int(window), C, G, float(offset)),
        stream=stream,
    )


def penalty_c51(logits_c, q, support, weight: float, d, grad, stream=None) -> None:
    """``d [B, A]`` = Q(x') - q and ``grad [B, A, K]`` = d loss / d logits at x' (written)."""
    B, A, K = logits_c.shape
    check("causal.penalty_c51", "logits_c", logits_c, F32, (B, A, K))
    check("causal.penalty_c51", "q", q, F32, (B, A))
    check("causal.penalty_c51", "support", support, F32, (K,))
    check("causal.penalty_c51", "d", d, F32, (B, A))
    check("causal.penalty_c51", "grad", grad, F32, (B, A, K))
    grid, block = warp_grid(B * A)
    launch("causal", "penalty_c51", grid, block, (logits_c, q, support, d, grad, B, A, K, float(weight)), stream=stream)


def penalty_quantile(theta_c, q, weight: float, d, grad, stream=None) -> None:
    """``d [B, A]`` = Q(x') - q and ``grad [B, N, A]`` = d loss / d theta at x' (written)."""
    B, N, A = theta_c.shape
    check("causal.penalty_quantile", "theta_c", theta_c, F32, (B, N, A))
    check("causal.penalty_quantile", "q", q, F32, (B, A))
    check("causal.penalty_quantile", "d", d, F32, (B, A))
    check("causal.penalty_quantile", "grad", grad, F32, (B, N, A))
    grid, block = warp_grid(B * A)
    launch("causal", "penalty_quantile", grid, block, (theta_c, q, d, grad, B, N, A, float(weight)), stream=stream)


def reduce(d, state, counter, weight: float, stream=None) -> None:
    """The loss, the group and its sensitivity into ``state [2 + G]``; then ``counter[0] += 1``."""
    R = d.size
    G = state.shape[0] - 2
    check("causal.reduce", "d", d, F32, tuple(d.shape))
    check("causal.reduce", "state", state, F32, (G + 2,))
    check("causal.reduce", "counter", counter, I64, (1,))
    launch("causal", "reduce", 1, THREADS, (d, state, counter, R, G, float(weight)), stream=stream)
