"""Launchers for ``cuda_src/denoise.cu`` (twin and equations: ``cudarl/reference/denoise.py``)."""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ._arrays import check
from .horizons import total

__all__ = ["corrupt", "loss", "total"]

F32 = np.float32
_THREADS = 256
_MAX_BLOCKS = 4096


def corrupt(x, out, counter, p, seed, stream_id) -> None:
    """Masking noise: ``out`` = ``x`` with elements zeroed where their draw is below ``p``. 1 launch."""
    w = "denoise.corrupt"
    check(w, "x", x, F32, x.shape)
    check(w, "out", out, F32, x.shape)
    check(w, "counter", counter, np.int64, (1,))
    n = int(x.size)
    grid = min(blocks_for((n + 3) // 4, _THREADS), _MAX_BLOCKS)
    launch(
        "denoise",
        "corrupt",
        grid,
        _THREADS,
        (x, out, counter, n, float(p), int(seed) & 0xFFFFFFFFFFFFFFFF, int(stream_id) & 0xFFFFFFFF),
    )


def loss(recon, clean, grad, loss_per, counter, scale) -> None:
    """The reconstruction loss's gradient and per-sample loss, and the counter's advance. 1 launch."""
    w = "denoise.loss"
    B, m = recon.shape
    check(w, "recon", recon, F32, (B, m))
    check(w, "clean", clean, F32, (B, m))
    check(w, "grad", grad, F32, (B, m))
    check(w, "loss_per", loss_per, F32, (B,))
    check(w, "counter", counter, np.int64, (1,))
    launch("denoise", "loss", blocks_for(B, 128), 128, (recon, clean, grad, loss_per, counter, B, m, float(scale)))
