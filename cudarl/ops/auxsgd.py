"""Launchers for ``cuda_src/auxsgd.cu`` (twin: ``cudarl/reference/auxsgd.py``)."""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ._arrays import check

_THREADS = 256
_MAX_BLOCKS = 1024


def step(p, g, lr, clear: bool = True) -> None:
    """``p -= lr g`` then ``g[:] = 0`` if ``clear``, over float32 ``[n]`` spans (contiguous views). 1 launch."""
    (n,) = p.shape
    check("auxsgd.step", "p", p, np.float32, (n,))
    check("auxsgd.step", "g", g, np.float32, (n,))
    launch(
        "auxsgd", "step", min(blocks_for(n, _THREADS), _MAX_BLOCKS), _THREADS, (p, g, n, float(lr), int(bool(clear)))
    )
