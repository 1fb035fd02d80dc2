"""Launchers for ``cuda_src/regularizers.cu`` (twin: ``cudarl/reference/regularizers.py``).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read.
"""

from __future__ import annotations

import numpy as np

from ..kernels import launch
from ._arrays import check, warp_grid

F32, I32 = np.float32, np.int32
THREADS = 256  # must equal RG_THREADS


def mean(x, out, scale, stream=None) -> None:
    """``out[0] = scale * sum_i x_i`` over float32 ``[n]`` by one block in a fixed order."""
    w = "regularizers.mean"
    (n,) = x.shape
    check(w, "x", x, F32, (n,))
    check(w, "out", out, F32, (1,))
    launch(
        "regularizers",
        "mean",
        1,
        THREADS,
        (x, out, n, float(scale)),
        stream=stream,
    )


def cql_c51(logits, a_data, support, alpha, out_cql_per, out_loss, out_grad, accumulate=False, stream=None) -> None:
    """CQL for C51: writes ``out_cql_per [B]``, ``out_loss [1]``; writes or adds ``out_grad [B, A, K]``."""
    w = "regularizers.cql_c51"
    B, A, K = logits.shape
    if A > 32:
        raise ValueError(f"{w}: at most 32 actions (one lane each), got {A}")
    check(w, "logits", logits, F32, (B, A, K))
    check(w, "a_data", a_data, I32, (B,))
    check(w, "support", support, F32, (K,))
    check(w, "out_cql_per", out_cql_per, F32, (B,))
    check(w, "out_loss", out_loss, F32, (1,))
    check(w, "out_grad", out_grad, F32, (B, A, K))
    grid, block = warp_grid(B)
    launch(
        "regularizers",
        "cql_c51",
        grid,
        block,
        (logits, a_data, support, out_cql_per, out_grad, B, A, K, float(alpha), int(bool(accumulate))),
        stream=stream,
    )
    mean(out_cql_per, out_loss, float(alpha) / B, stream=stream)


def cql_quantile(theta, a_data, alpha, out_cql_per, out_loss, out_grad, accumulate=False, stream=None) -> None:
    """CQL for IQN/QR on ``theta [B, N, A]``: writes ``out_cql_per [B]``, ``out_loss [1]``; writes or adds
    ``out_grad [B, N, A]``."""
    w = "regularizers.cql_quantile"
    B, N, A = theta.shape
    if A > 32:
        raise ValueError(f"{w}: at most 32 actions (one lane each), got {A}")
    check(w, "theta", theta, F32, (B, N, A))
    check(w, "a_data", a_data, I32, (B,))
    check(w, "out_cql_per", out_cql_per, F32, (B,))
    check(w, "out_loss", out_loss, F32, (1,))
    check(w, "out_grad", out_grad, F32, (B, N, A))
    grid, block = warp_grid(B)
    launch(
        "regularizers",
        "cql_quantile",
        grid,
        block,
        (theta, a_data, out_cql_per, out_grad, B, A, N, float(alpha), int(bool(accumulate))),
        stream=stream,
    )
    mean(out_cql_per, out_loss, float(alpha) / B, stream=stream)
