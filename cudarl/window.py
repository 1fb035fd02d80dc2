"""``Windows``: the network's observations gathered from state rows and the device-resident feature matrix.

Environments and the replay keep observations by reference (state rows: the bar, the mirror flag, the
position features; :mod:`cudarl.reference.window`), so neither grows with the window; the acting step
and the train step gather the windows they feed the network with one launch of the ``window`` family.
"""

from __future__ import annotations

import numpy as np

from .backend import family
from .reference.window import MAX_BARS, STATE_DIM, width


class Windows:
    """The feature matrix of one market and the window the network reads.

    Args:
        features: float32 ``[T, F]`` of the backend ``xp`` (kept, not copied: the env's).
        sign: float32 ``[F]``, -1 on the return-sign columns (the mirror negates them), +1 elsewhere.
        window: bars per observation (>= 1).
        xp: ``numpy`` or ``cupy``.

    Attributes: :attr:`window`, :attr:`n_features`, :attr:`width` (``window * (F + 2)``, the network's
    input), :attr:`state_dim` (columns of a state row).
    """

    def __init__(self, features, sign, window: int, xp):
        if isinstance(window, bool) or int(window) != window or int(window) < 1:
            raise ValueError(f"window: expected an integer >= 1, got {window!r}")
        t_n, f_n = features.shape
        if t_n >= MAX_BARS:
            raise ValueError(f"features: {t_n} bars; state rows hold bar indices exactly below {MAX_BARS}")
        self.features, self.sign, self.xp = features, sign, xp
        self.window, self.n_features = int(window), int(f_n)
        self.width = width(f_n, self.window)
        self.state_dim = STATE_DIM
        self._ops = family("window", xp)

    def gather(self, rows, out) -> None:
        """``out [n, width]`` from ``rows [n, state_dim]`` (capture-safe: one launch into ``out``)."""
        self._ops.gather(rows, self.features, self.sign, out, self.window)

    def of(self, rows) -> np.ndarray:
        """A new array of the windows of ``rows`` (outside any capture: it allocates)."""
        out = self.xp.zeros((rows.shape[0], self.width), np.float32)
        self.gather(rows, out)
        return out
