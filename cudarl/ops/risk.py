"""Launchers for ``cuda_src/risk.cu`` (twin and equations: ``cudarl/reference/risk.py``)."""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.risk import scales
from ..reference.window import STATE_DIM
from ._arrays import check
from .horizons import total

F32 = np.float32
_THREADS = 128


def loss(pred, rows, up, down, k, t_end, inv_sigma, weight, loss_per, valid_per, grad, out) -> None:
    """The risk loss (see the reference): 1 launch, then 2 one-block reductions into ``out [2]``."""
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
    if not 0 < int(t_end) <= T or int(k) < 1:
        raise ValueError(f"{w}: need k >= 1 and t_end in (0, {T}], got k={k}, t_end={t_end}")
    inv_k, vol_scale, dd_scale = scales(int(k), inv_sigma)
    scale = float(F32(weight / B))
    launch(
        "risk",
        "loss",
        blocks_for(B, _THREADS),
        _THREADS,
        (pred, rows, up, down, loss_per, valid_per, grad, B, int(k), int(t_end), inv_k, vol_scale, dd_scale, scale),
    )
    total(loss_per, out[0:1], 1.0)
    total(valid_per, out[1:2], 1.0 / B)
