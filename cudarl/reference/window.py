"""NumPy twin of ``cuda_src/window.cu``: observation windows gathered from the feature matrix.

Environments and replay rows keep an observation *by reference*, a state row of :data:`STATE_DIM`
float32 columns (:data:`STATE_COLUMNS`)::

    bar       the bar t observed now (an exact integer: bar indices stay below 2**24)
    mirror    1.0 on the env's directional mirror rows (return-sign columns negated), else 0.0
    position  the position held entering the step, p_{t-1}
    hold      min(hold, hold_cap) / hold_cap

so a replay row costs the same whatever the window. The network's input is gathered from the
device-resident feature matrix ``features [T, F]`` when acting and when sampling: ``window`` bars
``t - window + 1 .. t``, oldest first, each ``F + 2`` wide::

    out[i, w, :F]  = features[b] (* sign on a mirror row),   b = bar_i - (window - 1) + w
    out[i, w, F:]  = (position, hold) on the newest bar (w = window - 1), zeros on the others

A bar before the first (``b < 0``) is a row of zeros. Nothing after bar t is read: a window never
reaches past the bar it observes (tests/unit/test_windows.py changes every later bar and sees no
earlier observation move). With ``window = 1`` the row is ``[features[t], position, hold]``, the
observation the env wrote before windows existed, bit for bit.
"""

from __future__ import annotations

import numpy as np

from . import philox

#: The columns of a state row, in order.
STATE_COLUMNS = ("bar", "mirror", "position", "hold")
STATE_DIM = len(STATE_COLUMNS)
BAR, MIRROR, POSITION, HOLD = range(STATE_DIM)
#: Columns after a bar's features: the position and the hold fraction (zeros except on the newest bar).
N_POSITION_FEATURES = 2
#: Bar indices are float32 integers in a state row: exact below this.
MAX_BARS = 1 << 24


def width(n_features: int, window: int) -> int:
    """Columns of one gathered observation: ``window * (n_features + 2)``."""
    return int(window) * (int(n_features) + N_POSITION_FEATURES)


def gather(rows, features, sign, out, window: int) -> None:
    """Observation windows of ``n`` state rows.

    Args:
        rows: float32 ``[n, STATE_DIM]`` state rows (module docstring).
        features: float32 ``[T, F]``, the feature matrix (row t known at close[t]).
        sign: float32 ``[F]``, -1 on the return-sign columns (which a mirror row negates), +1 elsewhere.
        out: float32 ``[n, window * (F + 2)]``, written.
        window: bars per observation (>= 1).
    Bars outside ``[0, T)`` (before the first; no row names a later one) give rows of zeros.
    """
    n, (t_n, f_n) = rows.shape[0], features.shape
    view = out.reshape(n, window, f_n + N_POSITION_FEATURES)
    feats = view[:, :, :f_n]
    b = rows[:, BAR].astype(np.int64)[:, None] - (window - 1) + np.arange(window)[None, :]  # [n, window]
    inside = (b >= 0) & (b < t_n)
    every = bool(inside.all())
    # taken straight into ``out`` (the host walk gathers over a thousand small blocks)
    np.take(features, b if every else np.where(inside, b, 0), axis=0, out=feats, mode="clip")  # in range
    mirrored = rows[:, MIRROR] != 0
    if mirrored.any():
        feats[mirrored] *= sign
    if not every:
        feats[~inside] = 0
    view[:, :, f_n:] = 0
    view[:, -1, f_n] = rows[:, POSITION]
    view[:, -1, f_n + 1] = rows[:, HOLD]


#: Philox stream id of :func:`noise`'s draws ("noise").
NOISE_STREAM = 0x6E6F6973
#: sqrt(3): the sum of four uniforms on [0, 1) has variance 1/3.
_SQRT3 = 1.7320508075688772


def noise_scale(std: float) -> np.float32:
    """The float32 factor :func:`noise` multiplies its centred sum of four uniforms by, for noise of
    standard deviation ``std`` (one rounding, on the host, shared by both faces)."""
    return np.float32(float(std) * _SQRT3)


def noise_elements(n: int, window: int, n_features: int) -> int:
    """The feature elements :func:`noise` draws for (one Philox block each), refused past uint32's range
    (both faces index the blocks by a uint32)."""
    m = int(n) * int(window) * int(n_features)
    if m >= 1 << 32:
        raise ValueError(f"window.noise: {m} feature elements; Philox blocks are indexed by uint32")
    return m


def noise(x, counter, window: int, n_features: int, scale, seed: int, stream_id: int = NOISE_STREAM) -> None:
    """Zero-mean noise added in place to the feature columns of observation windows (the position columns
    are left alone): for feature element ``e`` (row-major over ``[n, window, n_features]``)::

        u = the 4 uniforms of Philox block e of the stream (seed, counter[0], stream_id)
        x[e] += scale * (((u0 + u1) + (u2 + u3)) - 2)

    The sum of four uniforms (Irwin-Hall) has mean 2 and variance 1/3, so :func:`noise_scale` (std)
    gives noise of that standard deviation, bell-shaped on ``+-2 sqrt(3) std``. Float32, round to nearest
    at each step, no transcendental function: the kernel equals this bit for bit. Training on inputs
    with zero-mean noise of variance s^2 is, to second order, Tikhonov regularisation with weight s^2
    (Bishop 1995, "Training with noise is equivalent to Tikhonov regularization"); for a linear body on
    standardised inputs it is ridge regression with penalty ``N s^2``.

    Args:
        x: float32 ``[n, window * (n_features + 2)]``, the gathered windows (:func:`gather`), written.
        counter: int64 ``[1]``, read (the draws are fresh whenever it moves: the learner's step).
        scale: float32, :func:`noise_scale` of the standard deviation.
    """
    n, f_n = x.shape[0], int(n_features)
    m = noise_elements(n, window, f_n)
    u = philox.to_uniform(philox.blocks(int(seed), int(counter[0]), int(stream_id), np.arange(m, dtype=np.uint64)))
    z = ((u[:, 0] + u[:, 1]) + (u[:, 2] + u[:, 3])) - np.float32(2)
    feats = x.reshape(n, int(window), f_n + N_POSITION_FEATURES)[:, :, :f_n]
    feats += (np.float32(scale) * z).reshape(n, int(window), f_n)
