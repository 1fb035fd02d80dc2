"""Launchers for ``cuda_src/risk.cu`` (twin and equations: ``cudarl/reference/risk.py``)."""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.risk import scales
from ..reference.window import STATE_DIM
from ._arrays import check, check_counter
from .horizons import totals_scales

F32 = np.float32
_THREADS = 128


def loss(pred, rows, up, down, k, t_end, inv_sigma, weight, loss_per, valid_per, grad, out, done) -> None:
    """The risk loss (see the reference) and its two batch totals into ``out [2]``, in 1 launch (the
    totals' bits are :func:`cudarl.ops.horizons.total`'s). ``done`` is a uint32 ``[1]`` ticket counter,
    0 before the launch and left 0."""
    w = "risk.loss"
    B = pred.shape[0]
    (T,) = up.shape
    check(w, "pred", pred, F32, (B, 2))
    check(w, "rows", rows, F32, (B, STATE_DIM))
    check(w, "up", up, F32, (T,))
    check(w, "down", down, F32, (T,))
    check(w, "loss_per", loss_per, F32, (B,))
    check(w, "valid_per", valid_per, F32, (B,))
    check(w, "grad", grad, F32, (B, 2))
    check(w, "out", out, F32, (2,))
    check_counter(w, "done", done)
    if not 0 < int(t_end) <= T or int(k) < 1:
        raise ValueError(f"{w}: need k >= 1 and t_end in (0, {T}], got k={k}, t_end={t_end}")
    inv_k, vol_scale, dd_scale = scales(int(k), inv_sigma)
    scale = float(F32(weight / B))
    launch(
        "risk",
        "loss",
        blocks_for(B, _THREADS),
        _THREADS,
        (pred, rows, up, down, loss_per, valid_per, grad, out, done, B, int(k), int(t_end), inv_k, vol_scale,
         dd_scale, scale, *totals_scales(B)),
    )  # fmt: skip
