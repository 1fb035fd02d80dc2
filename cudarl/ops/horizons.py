"""Launchers for ``cuda_src/horizons.cu`` (twin and equations: ``cudarl/reference/horizons.py``)."""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.window import STATE_DIM
from . import regularizers
from ._arrays import check, check_counter

F32, I32 = np.float32, np.int32
_THREADS = 128


def total(per, out, scale) -> None:
    """``out[0] = scale sum_b per[b]``: one block in a fixed order (deterministic)."""
    regularizers.mean(per, out, scale)


def loss(pred, rows, up, down, horizons, hscale, t_end, weight, loss_per, valid_per, grad, out, done) -> None:
    """The multi-horizon loss (see the reference) and its two batch totals into ``out [2]``, in 1 launch:
    the block that finishes last sums them in the order of :func:`total` (the same bits). ``done`` is a
    uint32 ``[1]`` ticket counter, 0 before the launch and left 0."""
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
    check_counter(w, "done", done)
    if not 0 < int(t_end) <= T:
        raise ValueError(f"{w}: t_end {t_end} outside (0, {T}]")
    scale = float(F32(weight / (B * H)))
    launch(
        "horizons",
        "loss",
        blocks_for(B, _THREADS),
        _THREADS,
        (pred, rows, up, down, horizons, hscale, loss_per, valid_per, grad, out, done, B, H, int(t_end), scale,
         *totals_scales(B)),
    )  # fmt: skip


def totals_scales(B: int) -> tuple[float, float]:
    """The scales of the two batch totals (the loss, the valid share): what :func:`total` was given."""
    return 1.0, 1.0 / B
