"""Launchers for ``cuda_src/horizons.cu`` (twin and equations: ``cudarl/reference/horizons.py``)."""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.window import STATE_DIM
from . import regularizers
from ._arrays import check

F32, I32 = np.float32, np.int32
_THREADS = 128


def total(per, out, scale) -> None:
    """``out[0] = scale sum_b per[b]``: one block in a fixed order (deterministic)."""
    regularizers.mean(per, out, scale)


def loss(pred, rows, up, down, horizons, hscale, t_end, weight, loss_per, valid_per, grad, out) -> None:
    """The multi-horizon loss (see the reference): 1 launch, then 2 one-block reductions into ``out [2]``."""
    w = "horizons.loss"
    B, H = pred.shape
    (T,) = up.shape
    check(w, "pred", pred, F32, (B, H))
    check(w, "rows", rows, F32, (B, STATE_DIM))
    check(w, "up", up, F32, (T,))
    check(w, "down", down, F32, (T,))
    check(w, "horizons", horizons, I32, (H,))
    check(w, "hscale", hscale, F32, (H,))
    check(w, "loss_per", loss_per, F32, (B,))
    check(w, "valid_per", valid_per, F32, (B,))
    check(w, "grad", grad, F32, (B, H))
    check(w, "out", out, F32, (2,))
    if not 0 < int(t_end) <= T:
        raise ValueError(f"{w}: t_end {t_end} outside (0, {T}]")
    scale = float(F32(weight / (B * H)))
    launch(
        "horizons",
        "loss",
        blocks_for(B, _THREADS),
        _THREADS,
        (pred, rows, up, down, horizons, hscale, loss_per, valid_per, grad, B, H, int(t_end), scale),
    )
    total(loss_per, out[0:1], 1.0)
    total(valid_per, out[1:2], 1.0 / B)
