"""Shape and dtype checks shared by the loss-family launchers (c51, quantile, regularizers,
popart, qstats). Host-side metadata only: nothing here reads device memory, so it is
capture-safe."""

from __future__ import annotations

import numpy as np


def check(where: str, name: str, a, dtype, shape: tuple) -> None:
    """Raise ``ValueError`` unless ``a`` has ``dtype`` and ``shape`` (``None`` entries match any)."""
    if a is None:
        raise ValueError(f"{where}: {name} is required (disabled features are not launched)")
    if np.dtype(a.dtype) != np.dtype(dtype):
        raise ValueError(f"{where}: {name} has dtype {a.dtype}, expected {np.dtype(dtype)}")
    if len(a.shape) != len(shape) or any(s is not None and s != t for s, t in zip(shape, a.shape, strict=True)):
        want = "[" + ", ".join("?" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{where}: {name} has shape {tuple(a.shape)}, expected {want}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{where}: {name} must be C-contiguous")


def check_counter(where: str, name: str, a) -> None:
    """A uint32 ``[1]`` ticket counter of a kernel that finishes with ``cudarl::last_block``: it
    must hold 0 before the launch (allocate it with zeros; the kernel leaves it 0)."""
    check(where, name, a, np.uint32, (1,))


#: Warps per block for the one-warp-per-sample kernels.
WARPS_PER_BLOCK = 4


def warp_grid(n: int) -> tuple[int, int]:
    """``(grid, block)`` for one warp per item over ``n`` items."""
    return max(1, (int(n) + WARPS_PER_BLOCK - 1) // WARPS_PER_BLOCK), 32 * WARPS_PER_BLOCK
