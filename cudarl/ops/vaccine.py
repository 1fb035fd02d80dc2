"""Launchers for ``cuda_src/vaccine.cu`` (twin: ``cudarl/reference/vaccine.py``, the equations).

Shape/dtype checks, then a launch into given buffers: no allocation, sync or device read.
"""

from __future__ import annotations

import numpy as np

from ..kernels import blocks_for, launch
from ..reference.vaccine import STATE, blocks
from ._arrays import check

F32 = np.float32
THREADS = 256  # must equal VC_THREADS (and reference.vaccine.CHUNK VC_CHUNK)


def _range(where: str, n: int, lo: int, hi: int) -> None:
    if not 0 <= lo < hi <= n:
        raise ValueError(f"{where}: the encoder's slice [{lo}, {hi}) is not inside [0, {n})")


def dots_control(full, aux, partial, state, done, lo: int, hi: int, beta: float, stream=None) -> None:
    """One launch: ``partial [blocks(hi - lo), 3]``, per chunk of ``[lo, hi)``, ``(g_m . g_a, |g_m|^2, |g_a|^2)``;
    then the last block to finish (the integer ticket ``done [1]`` uint32, 0 before and left 0) the cosine,
    the coefficient and the target's EMA into ``state [5]`` (read, then written)."""
    (n,) = full.shape
    _range("vaccine.dots_control", n, lo, hi)
    check("vaccine.dots_control", "full", full, F32, (n,))
    check("vaccine.dots_control", "aux", aux, F32, (n,))
    P = blocks(hi - lo)
    check("vaccine.dots_control", "partial", partial, F32, (P, 3))
    check("vaccine.dots_control", "state", state, F32, (STATE,))
    check("vaccine.dots_control", "done", done, np.uint32, (1,))
    args = (full, aux, partial, state, done, int(lo), int(hi), float(beta))
    launch("vaccine", "dots_control", P, THREADS, args, stream=stream)


def apply(full, aux, grads, state, lo: int, hi: int, stream=None) -> None:
    """``grads = full + c (full - aux)`` on ``[lo, hi)``, ``full`` elsewhere (``grads`` may be ``full`` or ``aux``)."""
    (n,) = full.shape
    _range("vaccine.apply", n, lo, hi)
    for name, a in (("full", full), ("aux", aux), ("grads", grads)):
        check("vaccine.apply", name, a, F32, (n,))
    check("vaccine.apply", "state", state, F32, (STATE,))
    launch(
        "vaccine", "apply", min(blocks_for(n), 4096), 256, (full, aux, grads, state, n, int(lo), int(hi)), stream=stream
    )
