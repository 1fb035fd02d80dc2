"""The sub-batch rows of the auxiliary signals' own passes: twin of ``cuda_src/auxgrad.cu``.

* :func:`spread_rows`: the sub-batch the ``denoise`` and ``causal`` passes read (``agent.aux_batch``),
  ``R`` of the batch's ``B`` rows spread evenly over it (:func:`spread`)."""

from __future__ import annotations

import numpy as np


def spread(R: int, B: int) -> np.ndarray:
    """int64 ``[R]``: the batch rows ``floor(r B / R)``, ``r < R``, of a sub-batch of ``R`` rows out of ``B``
    (every row when ``R == B``; the first row always)."""
    if not 1 <= R <= B:
        raise ValueError(f"auxgrad.spread: {R} rows out of {B}")
    return np.arange(R, dtype=np.int64) * B // R


def spread_rows(dst, src) -> None:
    """``dst [R, n]`` = the rows :func:`spread` ``(R, B)`` of ``src [B, n]`` (float32)."""
    dst[...] = src[spread(dst.shape[0], src.shape[0])]
