"""Launchers for ``cuda_src/auxgrad.cu`` (twin: ``cudarl/reference/auxgrad.py``)."""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ._arrays import check


def copy(dst, src, stream=None) -> None:
    """``dst[:] = src`` over float32 ``[n]``."""
    (n,) = src.shape
    check("auxgrad.copy", "src", src, np.float32, (n,))
    check("auxgrad.copy", "dst", dst, np.float32, (n,))
    launch("auxgrad", "copy", min(blocks_for(n), 4096), 256, (dst, src, n), stream=stream)
