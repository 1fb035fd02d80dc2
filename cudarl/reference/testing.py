"""NumPy twin of cuda_src/testing.cu."""

from __future__ import annotations

import numpy as np


def spin_then_write(dst: np.ndarray, value: float, cycles: int) -> None:
    """``dst[0] = value`` (the CPU has nothing to wait for)."""
    dst[0] = np.float32(value)


def iota_sized(out: np.ndarray, n: np.ndarray) -> None:
    """``out[i] = i + 1`` for ``i < n[0]`` else 0."""
    size = int(n[0])
    idx = np.arange(out.size)
    out[...] = np.where(idx < size, idx + 1, 0).astype(np.float32)


def axpb(x: np.ndarray, a: float, b: float) -> None:
    """``x = a * x + b`` (float32; the GPU may fuse it into one FMA, within 1 ulp)."""
    x[...] = np.float32(a) * x + np.float32(b)


def empty(blocks: int = 1, threads: int = 32) -> None:
    """Nothing: the kernel has no work (it exists to time a graph node)."""


def fma(x: np.ndarray, a: float, b: float, iters: int) -> None:
    """``x = a * x + b`` repeated ``iters`` times (float32; the GPU rounds each step once, a fused
    multiply-add, where this rounds the product and the sum: within an ulp a step)."""
    a32, b32 = np.float32(a), np.float32(b)
    for _ in range(int(iters)):
        x[...] = a32 * x + b32
