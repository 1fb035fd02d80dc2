"""NumPy twin of cuda_src/util.cu, and of the batch mean the loss kernels end with."""

from __future__ import annotations

import numpy as np


def fill_u32(dst: np.ndarray, value: int) -> None:
    """``dst[:] = value`` over uint32 words."""
    dst.view(np.uint32)[...] = np.uint32(int(value) & 0xFFFFFFFF)


def check_copy(dst, src) -> None:
    if dst.size != src.size or dst.dtype != np.uint32 or src.dtype != np.uint32:
        raise ValueError(
            f"util.copy_u32: uint32 buffers of one size, got {dst.dtype} {dst.size} and {src.dtype} {src.size}"
        )


def copy_u32(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src`` over uint32 words of one size (their bits)."""
    check_copy(dst, src)
    dst[...] = src


def set_u64(dst: np.ndarray, bits: int) -> None:
    """``dst[0] = bits`` for a 1-element uint64 array."""
    dst[0] = np.uint64(bits)


def add_i64(dst: np.ndarray, by: int = 1) -> None:
    """``dst[0] += by``."""
    dst[0] += np.int64(by)


def add_f32(dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """``dst = a + b`` elementwise in float32 (``dst`` may be ``a`` or ``b``)."""
    if not (dst.size == a.size == b.size):
        raise ValueError(f"util.add_f32: sizes {dst.size}, {a.size}, {b.size} differ")
    np.add(a, b, out=dst, dtype=np.float32)


def weighted_mean(values, weights, scale, compute_dtype=np.float32):
    """``scale * sum_i weights_i * values_i`` (summed in float64), as a ``compute_dtype`` scalar.

    The twin of the importance-weighted batch mean the C51 and quantile loss kernels end with
    (``cudarl::block_weighted_sum`` in ``cuda_src/include/cudarl/reduce.cuh``: one block's
    fixed-order reduction, by the block of the launch that finishes last).
    """
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    return compute_dtype(float(scale) * float(np.sum(w * v)))
