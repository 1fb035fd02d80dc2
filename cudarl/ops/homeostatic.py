"""Launchers for ``cuda_src/homeostatic.cu`` (twin: ``cudarl/reference/homeostatic.py``).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read.
"""

from __future__ import annotations

import numpy as np

from ..kernels import launch
from ._arrays import check, warp_grid

F32 = np.float32
THREADS = 256  # must equal HS_THREADS


def probs(logits, p, stream=None) -> None:
    """``p [R, K]`` = the softmax of each row of float32 ``logits [R, K]``."""
    R, K = logits.shape
    check("homeostatic.probs", "logits", logits, F32, (R, K))
    check("homeostatic.probs", "p", p, F32, (R, K))
    grid, block = warp_grid(R)
    launch("homeostatic", "probs", grid, block, (logits, p, R, K), stream=stream)


def mass(p, m, stream=None) -> None:
    """``m [K]`` = the mean of ``p [R, K]`` over rows (one block an atom, one fixed order)."""
    R, K = p.shape
    check("homeostatic.mass", "p", p, F32, (R, K))
    check("homeostatic.mass", "m", m, F32, (K,))
    launch("homeostatic", "mass", K, THREADS, (p, m, R, K), stream=stream)


def control(m, g, state, target: float, weight: float, stream=None) -> None:
    """``g [K]`` and ``state [3] = [loss, u, H]`` from the batch-mean masses ``m [K]``."""
    (K,) = m.shape
    check("homeostatic.control", "m", m, F32, (K,))
    check("homeostatic.control", "g", g, F32, (K,))
    check("homeostatic.control", "state", state, F32, (3,))
    launch("homeostatic", "control", 1, THREADS, (m, g, state, K, float(target), float(weight)), stream=stream)


def grad(p, g, out, accumulate: bool = False, stream=None) -> None:
    """``out [R, K]`` (+)= ``(1/R) p (g - sum_k p_k g_k)``."""
    R, K = p.shape
    check("homeostatic.grad", "p", p, F32, (R, K))
    check("homeostatic.grad", "g", g, F32, (K,))
    check("homeostatic.grad", "out", out, F32, (R, K))
    grid, block = warp_grid(R)
    launch("homeostatic", "grad", grid, block, (p, g, out, R, K, int(bool(accumulate))), stream=stream)
