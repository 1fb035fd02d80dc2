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
    _dots_control("dots_control", (full,), aux, partial, state, done, lo, hi, beta, stream)


def dots_control_plus(full, plus, aux, partial, state, done, lo: int, hi: int, beta: float, stream=None) -> None:
    """:func:`dots_control` over ``full + plus`` (float32 ``[n]`` each; the sum made on the fly)."""
    _dots_control("dots_control_plus", (full, plus), aux, partial, state, done, lo, hi, beta, stream)


def _dots_control(op, fulls, aux, partial, state, done, lo, hi, beta, stream) -> None:
    where = f"vaccine.{op}"
    (n,) = fulls[0].shape
    _range(where, n, lo, hi)
    for name, a in (*zip(("full", "plus"), fulls, strict=False), ("aux", aux)):
        check(where, name, a, F32, (n,))
    P = blocks(hi - lo)
    check(where, "partial", partial, F32, (P, 3))
    check(where, "state", state, F32, (STATE,))
    check(where, "done", done, np.uint32, (1,))
    args = (*fulls, aux, partial, state, done, int(lo), int(hi), float(beta))
    launch("vaccine", op, P, THREADS, args, stream=stream)


def apply(full, aux, grads, state, lo: int, hi: int, stream=None) -> None:
    """``grads = full + c (full - aux)`` on ``[lo, hi)``, ``full`` elsewhere (``grads`` may be ``full`` or ``aux``)."""
    _apply("apply", (full,), aux, grads, state, lo, hi, stream)


def apply_plus(full, plus, aux, grads, state, lo: int, hi: int, stream=None) -> None:
    """:func:`apply` over ``f = full + plus``: ``grads = f + c (f - aux)`` on ``[lo, hi)``, ``f`` elsewhere
    (``grads`` may be ``full``)."""
    _apply("apply_plus", (full, plus), aux, grads, state, lo, hi, stream)


def _apply(op, fulls, aux, grads, state, lo, hi, stream) -> None:
    where = f"vaccine.{op}"
    (n,) = fulls[0].shape
    _range(where, n, lo, hi)
    for name, a in (*zip(("full", "plus"), fulls, strict=False), ("aux", aux), ("grads", grads)):
        check(where, name, a, F32, (n,))
    check(where, "state", state, F32, (STATE,))
    args = (*fulls, aux, grads, state, n, int(lo), int(hi))
    launch("vaccine", op, min(blocks_for(n), 4096), 256, args, stream=stream)
