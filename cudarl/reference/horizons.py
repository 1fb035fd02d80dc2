"""Multi-horizon return targets and loss in NumPy: twin of ``cuda_src/horizons.cu``.

An auxiliary head on the encoder's output ``psi`` predicts the cumulative log return over several
horizons after the decision bar (the auxiliary-task idea of Jaderberg et al. 2017, "Reinforcement
Learning with Unsupervised Auxiliary Tasks" (UNREAL), with the several horizons of Fedus et al. 2019,
"Hyperbolic Discounting and Learning over Multiple Horizons", here as supervised returns rather than
value functions). For a state row with decision bar ``t`` (mirror flag m) and horizon ``k``::

    x_j      = log(1 + s ret[t + j]),   s = -1 on a mirror row, else +1   (the bar's log return)
    y_k      = hscale_k sum_{j < k} x_j,   hscale_k = 1 / (sigma sqrt(k))   (unit-scale targets)
    fits_k   = t + k + 1 < t_end        (ret[t + k - 1] reads the price at t + k + 1)
    e_bk     = (pred[b, k] - y_k) 1{fits_k}
    loss     = w / (B H) sum_{b, k} e_bk^2,     dloss / dpred[b, k] = 2 w / (B H) e_bk

``ret`` is the env's bar return (:func:`cudarl.reference.env.bar_returns`: the return a position
taken at close[t] earns), so every target comes from prices after the decision; a horizon that runs
past the split end (``t_end``) is masked, never read. ``sigma`` is the standard deviation of the
split's per-bar log returns (:class:`cudarl.auxiliary.future.FutureReturns`). The targets are never
an input: the window gather reads bars up to ``t`` only (tests/unit/test_aux_heads.py).
"""

from __future__ import annotations

import numpy as np

from .window import BAR, MIRROR

F32 = np.float32


def future_log_returns(ret) -> tuple[np.ndarray, np.ndarray]:
    """``(up, down)`` float32 ``[T]``: ``log(1 + ret)`` and the mirrored market's ``log(1 - ret)``
    (computed in float64; ``1 - ret`` is floored at 1e-12, a bar that loses everything)."""
    r = np.asarray(ret, np.float64)
    up = np.log(np.maximum(1.0 + r, 1e-12))
    down = np.log(np.maximum(1.0 - r, 1e-12))
    return up.astype(F32), down.astype(F32)


def future_windows(rows, up, down, k: int, t_end: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` log returns after each row's decision bar: ``(x [n, k], fits [n] bool)``. ``x[:, j]``
    is zero where bar ``t + j``'s return is not inside the split (``t + j + 2 >= t_end``; nothing past
    it is read); ``fits``: all ``k`` are (``t + k + 1 < t_end``)."""
    rows = np.asarray(rows)
    t = rows[:, BAR].astype(np.int64)
    fits = (t >= 0) & (t + k + 1 < t_end)
    j = np.arange(k)[None, :]
    inside = (t[:, None] >= 0) & (t[:, None] + j + 2 < t_end)
    idx = np.where(inside, t[:, None] + j, 0)
    src = np.where((rows[:, MIRROR] != 0)[:, None], np.asarray(down)[idx], np.asarray(up)[idx])
    return np.where(inside, src, src.dtype.type(0)), fits


def total(per, out, scale) -> None:
    """``out[0] = scale sum_b per[b]`` (summed in float64; the launcher's is one block, fixed order)."""
    out[0] = float(np.sum(np.asarray(per, np.float64))) * scale


def loss(pred, rows, up, down, horizons, hscale, t_end, weight, loss_per, valid_per, grad, out, done=None) -> None:
    """The multi-horizon loss (module docstring).

    Args:
        pred: ``[B, H]`` the head's outputs (float32; float64 for gradient checks); rows: float32
            ``[B, STATE_DIM]`` state rows of the batch's ``s``; up, down: float32 ``[T]``
            (:func:`future_log_returns`); horizons: int32 ``[H]`` ascending; hscale: float32 ``[H]``;
            t_end: the split's end bar; weight: w.
        loss_per, valid_per: ``[B]``, written: ``w / (B H) sum_k e_bk^2`` and the share of horizons that fit.
        grad: ``[B, H]``, written: dloss/dpred.
        out: ``[2]``, written: the loss and the batch's mean share of horizons that fit.
        done: the launcher's ticket counter (its last block writes ``out``); unused here.
    """
    pred = np.asarray(pred)
    dt = pred.dtype.type
    B, H = pred.shape
    scale = dt(F32(weight / (B * H))) if dt is F32 else dt(weight / (B * H))
    x, _ = future_windows(rows, up, down, int(horizons[-1]), t_end)
    acc = np.cumsum(x, axis=1, dtype=x.dtype)  # sequential, as the kernel's running sum
    t = np.asarray(rows)[:, BAR].astype(np.int64)
    sq, v = np.zeros(B, dt), np.zeros(B, F32)
    for h, k in enumerate(np.asarray(horizons)):
        fits = (t >= 0) & (t + int(k) + 1 < t_end)
        y = (acc[:, int(k) - 1] * np.asarray(hscale)[h]).astype(dt)
        e = np.where(fits, pred[:, h] - y, dt(0))
        grad[:, h] = (dt(2) * scale) * e
        sq = sq + e * e
        v = v + fits.astype(F32)
    loss_per[:] = scale * sq
    valid_per[:] = v / F32(H)
    total(loss_per, out[0:1], 1.0)
    total(valid_per, out[1:2], 1.0 / B)
