"""Launchers for ``cuda_src/window.cu`` (twin and layouts: ``cudarl/reference/window.py``)."""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.window import NOISE_STREAM, STATE_DIM, noise_elements, width
from ._arrays import check

_THREADS = 256
#: Grid cap of the grid-stride loop (a window batch of 4096 envs x 64 bars x 12 floats is 3M threads).
_MAX_BLOCKS = 8192


def gather(rows, features, sign, out, window: int) -> None:
    """Observation windows ``out [n, window * (F + 2)]`` of the state rows ``rows [n, STATE_DIM]`` from
    ``features [T, F]`` and ``sign [F]`` (see the reference). 1 launch."""
    where = "window.gather"
    if features.ndim != 2 or rows.ndim != 2:
        raise ValueError(f"{where}: features [T, F] and rows [n, {STATE_DIM}], got {features.shape} and {rows.shape}")
    t_n, f_n = features.shape
    n = rows.shape[0]
    if int(window) < 1:
        raise ValueError(f"{where}: window must be >= 1, got {window}")
    check(where, "rows", rows, np.float32, (n, STATE_DIM))
    check(where, "features", features, np.float32, (t_n, f_n))
    check(where, "sign", sign, np.float32, (f_n,))
    check(where, "out", out, np.float32, (n, width(f_n, window)))
    launch(
        "window",
        "gather",
        min(blocks_for(out.size, _THREADS), _MAX_BLOCKS),
        _THREADS,
        (rows, features, sign, out, n, int(window), f_n, t_n),
    )


def noise(x, counter, window: int, n_features: int, scale, seed: int, stream_id: int = NOISE_STREAM) -> None:
    """Zero-mean noise into the feature columns of the windows ``x [n, window * (F + 2)]`` (in place), drawn
    from the Philox stream ``(seed, counter[0], stream_id)`` (see the reference). 1 launch."""
    where = "window.noise"
    if x.ndim != 2 or int(window) < 1 or int(n_features) < 1:
        raise ValueError(f"{where}: x [n, window * (F + 2)] with window, F >= 1, got {x.shape}, {window}, {n_features}")
    n = x.shape[0]
    check(where, "x", x, np.float32, (n, width(n_features, window)))
    check(where, "counter", counter, np.int64, (1,))
    m = noise_elements(n, window, n_features)
    launch(
        "window",
        "noise",
        min(blocks_for(max(m, 1), _THREADS), _MAX_BLOCKS),
        _THREADS,
        (x, counter, n, int(window), int(n_features), float(scale), int(seed) & 0xFFFFFFFFFFFFFFFF,
         int(stream_id) & 0xFFFFFFFF),
    )  # fmt: skip
