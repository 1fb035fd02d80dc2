"""NumPy twin of cuda_src/util.cu."""
from __future__ import annotations

import numpy as np


def fill_u32(dst: np.ndarray, value: int) -> None:
    """``dst[:] = value`` over uint32 words."""
    dst.view(np.uint32)[...] = np.uint32(int(value) & 0xFFFFFFFF)


def set_u64(dst: np.ndarray, bits: int) -> None:
    """``dst[0] = bits`` for a 1-element uint64 array."""
    dst[0] = np.uint64(bits)


def add_i64(dst: np.ndarray, by: int = 1) -> None:
    """``dst[0] += by``."""
    dst[0] += np.int64(by)
