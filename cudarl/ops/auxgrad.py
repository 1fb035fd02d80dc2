"""Launchers for ``cuda_src/auxgrad.cu`` (twin: ``cudarl/reference/auxgrad.py``): shape and dtype checks,
then a launch into given buffers (no allocation, sync or device read)."""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ._arrays import check


def spread_rows(dst, src, stream=None) -> None:
    """``dst [R, n]`` = the rows ``floor(r B / R)`` of ``src [B, n]`` (float32, ``1 <= R <= B``)."""
    B, n = src.shape
    R = dst.shape[0]
    if not 1 <= R <= B:
        raise ValueError(f"auxgrad.spread_rows: {R} rows out of {B}")
    check("auxgrad.spread_rows", "src", src, np.float32, (B, n))
    check("auxgrad.spread_rows", "dst", dst, np.float32, (R, n))
    launch("auxgrad", "spread_rows", min(blocks_for(R * n), 4096), 256, (dst, src, R, B, n), stream=stream)
