"""The risk head's targets and loss in NumPy: twin of ``cuda_src/risk.cu``.

An auxiliary head on ``psi`` predicts two risk measures of the next ``k`` bars after the decision
(auxiliary prediction tasks on the shared encoder, Jaderberg et al. 2017, UNREAL): their realised
volatility and their drawdown, the quantities a risk-aware trader conditions on. With the bar log
returns ``x_j`` of :func:`cudarl.reference.horizons.future_windows` (sign-flipped on a mirror row)::

    vol  = sqrt((1/k) sum_{j<k} x_j^2) / sigma                    (root mean square: realised volatility)
    dd   = max_j (peak_j - c_j) / (sigma sqrt(k)),  c_j = x_0 + .. + x_j,  peak_j = max(0, c_0, .., c_j)
    e    = (pred[b] - (vol, dd)) 1{t + k + 1 < t_end}               (masked past the split, never read)
    loss = w / B sum_b |e_b|^2,     dloss / dpred[b] = 2 w / B e_b

The head has its own optimiser step (the seed's "risk SGD"): plain SGD on the head's parameters
(:mod:`cudarl.reference.auxsgd`, rate ``agent.aux_risk_lr``) after the backward, which then clears
their gradient so the shared Adam leaves them alone; its ``dloss/dpsi`` joins the encoder's gradient,
scaled by ``w`` (``agent.aux_risk_weight``), for the shared Adam.
"""

from __future__ import annotations

import numpy as np

from .horizons import future_windows, total

F32 = np.float32


def scales(k: int, inv_sigma: float) -> tuple[float, float, float]:
    """``(1/k, 1/sigma, 1/(sigma sqrt(k)))`` as float32 values, the kernel's arguments."""
    return float(F32(1.0 / k)), float(F32(inv_sigma)), float(F32(inv_sigma / np.sqrt(k)))


def targets(x) -> tuple[np.ndarray, np.ndarray]:
    """Unscaled ``(rms [n], drawdown [n])`` of log-return paths ``x [n, k]``, in the kernel's order
    (sequential running sums, float32 rounding of each step)."""
    x = np.asarray(x)
    c = np.cumsum(x, axis=1, dtype=x.dtype)
    peak = np.maximum.accumulate(np.maximum(c, x.dtype.type(0)), axis=1)
    dd = np.max(peak - c, axis=1)
    ss = np.cumsum(x * x, axis=1, dtype=x.dtype)[:, -1]
    return ss, dd


def loss(pred, rows, up, down, k, t_end, inv_sigma, weight, loss_per, valid_per, grad, out, done=None) -> None:
    """The risk loss (module docstring).

    Args:
        pred: ``[B, 2]`` (volatility, drawdown) predictions (float32; float64 for gradient checks);
            rows: float32 ``[B, STATE_DIM]``; up, down: float32 ``[T]``
            (:func:`cudarl.reference.horizons.future_log_returns`); k: bars ahead; t_end: the split's
            end; inv_sigma: 1 / the split's per-bar log-return deviation; weight: w.
        loss_per, valid_per: ``[B]``, written (valid_per: 1 where the k bars fit, else 0).
        grad: ``[B, 2]``, written. out: ``[2]``, written: the loss and the batch's share that fits.
        done: the launcher's ticket counter (its last block writes ``out``); unused here.
    """
    pred = np.asarray(pred)
    dt = pred.dtype.type
    B = pred.shape[0]
    scale = dt(F32(weight / B)) if dt is F32 else dt(weight / B)
    inv_k, vol_scale, dd_scale = scales(int(k), inv_sigma)
    x, fits = future_windows(rows, up, down, int(k), t_end)
    ss, dd = targets(x)
    vol = np.sqrt(ss * F32(inv_k)) * F32(vol_scale)
    y = np.stack([vol, dd * F32(dd_scale)], axis=1).astype(dt)
    e = np.where(fits[:, None], pred - y, dt(0))
    grad[:] = (dt(2) * scale) * e
    loss_per[:] = scale * (e[:, 0] * e[:, 0] + e[:, 1] * e[:, 1])
    valid_per[:] = fits.astype(F32)
    total(loss_per, out[0:1], 1.0)
    total(valid_per, out[1:2], 1.0 / B)
